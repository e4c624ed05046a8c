"""``gpurig inventory --list | --graph [GROUP] | --host H``: the inventory as ansible-inventory shows it, vars resolved."""

from __future__ import annotations

import sys

from gpurig.cli.base import task
from gpurig.config import settings
from gpurig.errors import InventoryError

__all__ = ["inventory"]


@task(
    help={
        "list": "every group (its hosts and children) and every host's resolved vars, as JSON (ansible-inventory --list)",
        "graph": "the group tree from GROUP (default: all), hosts under their groups",
        "host": "one host's resolved vars as JSON",
        "vars": "with --graph: show vars under hosts and groups",
        "inventory": "inventory file, YAML or INI (default: inventory in gpurig.yaml / $GPURIG_INVENTORY, else inventory/hosts.yaml)",
    },
    optional=["graph"],
    auto_shortflags=False,
)
def inventory(c, list=False, graph=None, host=None, vars=False, inventory=None):  # noqa: A002 - flag names are Ansible's
    """Show the inventory as ansible-inventory would: --list (JSON), --graph [GROUP] or --host H."""
    from gpurig.inventory import listing as inventory_view
    from gpurig.inventory import load_inventory

    chosen = [flag for flag, given in (("--list", list), ("--graph", graph), ("--host", host)) if given]
    if len(chosen) != 1:
        raise InventoryError(
            f"give exactly one of --list, --graph or --host (got {', '.join(chosen) or 'none'})",
            "e.g. 'gpurig inventory --graph' or 'gpurig inventory --host a100-01'",
        )
    inv = load_inventory(settings(c.config, inventory=inventory).inventory)
    if list:
        sys.stdout.write(inventory_view.to_json(inventory_view.as_list(inv)))
    elif host:
        sys.stdout.write(inventory_view.to_json(inventory_view.host_vars(inv, host)))
    else:
        group = graph if isinstance(graph, str) else "all"
        sys.stdout.write("\n".join(inventory_view.graph(inv, group, show_vars=vars)) + "\n")

