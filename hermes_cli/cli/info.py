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
    from ..models.registry import BUILTIN, FAMILIES, default_model, family_of_type, locally_present
    from .hub import cached_models, cached_size

    name, why = default_model()
    rows: list[dict] = [
        {"family": f.name, "model": m, "present": locally_present(m)}
        for f in FAMILIES for m in f.examples
    ]
    listed = {r["model"] for r in rows}
    for model_id, model_type in cached_models().items():  # pulled or used before, of a family hermes runs
        kind = family_of_type(model_type)
        if model_id not in listed and kind is not None:
            rows.append({"family": kind.name, "model": model_id, "present": True})
    for r in rows:
        r["size_on_disk_bytes"] = cached_size(r["model"]) if r["present"] else None
    if json_out:
        print(json.dumps({"default": name, "default_reason": why, "models": rows, "builtin": list(BUILTIN)}))
        return
    from rich.table import Table

    table = Table(title="supported models")
    for col in ("family", "model", "weights here"):
        table.add_column(col, overflow="fold")  # narrow terminals wrap names instead of cutting them
    for r in rows:
        size = r["size_on_disk_bytes"]
        table.add_row(r["family"], r["model"], ("[green]yes[/]" + (f" · {_size(size)}" if size else ""))
                      if r["present"] else "no")
    for builtin_name, family in BUILTIN.items():
        table.add_row(family, builtin_name, "built in (random weights)")
    out.print(table)
    if quiet():
        return
    out.print(f"default here: [bold]{name}[/] ({why}); override with --model or HERMES_MODEL")
    out.print("any local directory holding one of these families works too: --model /path/to/model; "
              "hermes pull MODEL downloads one ahead of use")


def _size(n: int) -> str:
    """Bytes on disk, as people read them (1.8 GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


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
