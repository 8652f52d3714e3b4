"""An optional LLM judge for open-ended answers, over an OpenAI-compatible chat-completions API.

Used only with ``hermes eval --judge-url``. The prompt follows the Video-ChatGPT style the RVS
papers use: the judge says whether the prediction matches the reference and gives a 0–5 score,
as ``{"pred": "yes"|"no", "score": N}``. Plain ``urllib``; no SDK needed.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

from ..errors import HermesError

SYSTEM = (
    "You are an intelligent chatbot designed for evaluating the correctness of generative outputs "
    "for question-answer pairs. Your task is to compare the predicted answer with the correct answer "
    "and determine if they match meaningfully. Focus on the meaningful match between the predicted "
    "answer and the correct answer; consider synonyms or paraphrases as valid matches; evaluate the "
    "correctness of the prediction compared to the answer."
)
USER = (
    "Please evaluate the following video-based question-answer pair:\n\n"
    "Question: {question}\nCorrect Answer: {answer}\nPredicted Answer: {prediction}\n\n"
    "Provide your evaluation only as a yes/no and score where the score is an integer value between "
    "0 and 5, with 5 indicating the highest meaningful match. Please generate the response in the form "
    "of a Python dictionary string with keys 'pred' and 'score', where value of 'pred' is a string of "
    "'yes' or 'no' and value of 'score' is an INTEGER, not STRING. Only provide the Python dictionary "
    "string. For example, your response should look like this: {{'pred': 'yes', 'score': 4}}."
)


class JudgeError(HermesError):
    """The judge server failed or gave no verdict (one line)."""


class Judge:
    """Callable ``judge(question, answer, prediction) -> {"pred", "score", "model"}``."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout_s: float = 60.0):
        url = url.rstrip("/")
        if not url.endswith("/chat/completions"):
            url += "/chat/completions" if url.endswith("/v1") else "/v1/chat/completions"
        self.url, self.model, self.api_key, self.timeout_s = url, model, api_key, timeout_s

    def __call__(self, question: str, answer: str, prediction: str) -> dict:
        body = {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": USER.format(question=question, answer=answer, prediction=prediction)},
            ],
        }
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = json.loads(response.read().decode("utf-8"))
            text = data["choices"][0]["message"]["content"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise JudgeError(f"judge at {self.url} failed: {exc}") from None
        verdict = parse_verdict(text)
        verdict["model"] = self.model
        return verdict


def parse_verdict(text: str) -> dict:
    """``{'pred': 'yes', 'score': 4}`` (single or double quotes, extra prose around it) → dict."""
    pred = re.search(r"""['"]?pred['"]?\s*:\s*['"]?(yes|no)""", text, re.IGNORECASE)
    score = re.search(r"""['"]?score['"]?\s*:\s*['"]?(\d+(?:\.\d+)?)""", text, re.IGNORECASE)
    if not pred:
        raise JudgeError(f"judge reply has no yes/no verdict: {text[:80]!r}")
    return {"pred": pred.group(1).lower(), "score": float(score.group(1)) if score else None}
