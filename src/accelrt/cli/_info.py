"""``accelrt info``: backends, devices, properties and memory, as tables or JSON (the data
from :func:`accelrt._info.info_data`)."""

from __future__ import annotations

import argparse
import json

from .._text import printable
from .._units import format_bytes
from ._args import SubParsers
from ._output import _console


def _cmd_info(args: argparse.Namespace) -> int:
    from .._info import info_data

    data = info_data()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.table import Table
    from rich.text import Text

    console = _console()
    console.print(
        Text.assemble("accelerator: ", (printable(data["accelerator"] or "none"), "bold"))
    )
    console.print(
        f"backends: {', '.join(data['registered_backends'])} "
        f"(available: {', '.join(data['available_backends']) or 'none'})"
    )
    for name, reason in data["unavailable_backends"].items():  # the drivers' words
        console.print(f"{name}: unavailable: {printable(reason)}")
    core = data["allocator_core"]
    console.print(f"allocator core: {core['core']} ({core['reason']})")
    for dev in data["devices"]:  # names, vendors and versions as the drivers report them
        table = Table(title=dev["device"], show_header=False)
        table.add_column("property", style="bold")
        table.add_column("value")
        table.add_row("name", printable(dev["name"]))
        table.add_row("vendor", printable(dev["vendor"]))
        table.add_row("total memory", format_bytes(dev["total_memory_bytes"]))
        table.add_row("free memory", format_bytes(dev["free_memory_bytes"]))
        table.add_row("max allocation", format_bytes(dev["max_allocation_bytes"]))
        table.add_row("compute units", str(dev["compute_units"]))
        table.add_row("driver", printable(dev["driver_version"]))
        table.add_row("host accessible", str(dev["host_accessible"]))
        console.print(table)
    if not data["devices"]:
        console.print("no devices")
    return 0


def _add_info_parser(sub: SubParsers) -> None:
    """The ``info`` command's options."""
    info = sub.add_parser("info", help="show backends, devices, properties and memory")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)
