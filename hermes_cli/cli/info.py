"""``hermes models`` and ``hermes policies``: what can be used, without loading anything heavy."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from .console import out, quiet, set_verbosity
from .options import QuietOpt, VerboseOpt

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the list as one JSON document (for scripts).")]


def list_models(json_out: JsonOpt = False, quiet_: QuietOpt = False, verbose_: VerboseOpt = False) -> None:
    """List the supported model families, the default on this machine, and local weights."""
    set_verbosity(quiet_, verbose_)
    from ..models.registry import BUILTIN, FAMILIES, locally_present
    from .machine import default_model

    name, why = default_model()
    rows: list[dict] = [
        {"family": f.name, "model": m, "present": locally_present(m)}
        for f in FAMILIES for m in f.examples
    ]
    if json_out:
        print(json.dumps({"default": name, "default_reason": why, "models": rows, "builtin": list(BUILTIN)}))
        return
    from rich.table import Table

    table = Table(title="supported models")
    for col in ("family", "model", "weights here"):
        table.add_column(col, overflow="fold")  # narrow terminals wrap names instead of cutting them
    for r in rows:
        table.add_row(r["family"], r["model"], "[green]yes[/]" if r["present"] else "no")
    for builtin_name, family in BUILTIN.items():
        table.add_row(family, builtin_name, "built in (random weights)")
    out.print(table)
    if quiet():
        return
    out.print(f"default here: [bold]{name}[/] ({why}); override with --model or HERMES_MODEL")
    out.print("any local directory holding one of these families works too: --model /path/to/model")


def list_policies(json_out: JsonOpt = False, quiet_: QuietOpt = False, verbose_: VerboseOpt = False) -> None:
    """List the memory policies, what each keeps, and their parameters."""
    set_verbosity(quiet_, verbose_)
    from .catalog import load

    data = [{**p, "parameters": [{k: v for k, v in prm.items() if k != "type"} for prm in p["parameters"]]}
            for p in load()]
    if json_out:
        print(json.dumps(data))
        return
    for p in data:
        out.print(f"[bold]{p['name']}[/] — {p['keeps']}")
        for prm in p["parameters"]:
            out.print(f"    {prm['name']} = {prm['default']!r}  [dim]{prm['help']}[/]")
    if not quiet():
        out.print("set parameters with --policy-opt KEY=VALUE")
