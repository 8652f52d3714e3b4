"""`hermes eval`: benchmark annotations in the HERMES / ReKV JSON format, streamed through a session.

- ``annotations``: load and validate annotation files into dataclasses, with a problems summary.
- ``answers``: lettered multiple-choice prompts, answer-letter parsing, a lenient open-ended match.
- ``runner``: the streaming and offline protocols, results JSONL (resumable), aggregation.
- ``judge``: an optional OpenAI-compatible judge for open-ended answers.

Nothing here imports torch at module import; the model is loaded only when a run needs it.
"""
