"""Which reader an inventory file goes to: YAML or INI, decided as ansible-core's plugin order decides."""

from __future__ import annotations

from pathlib import Path

from gpurig.errors import InventoryError
from gpurig.inventory.hostgroups import Inventory
from gpurig.inventory.ini import load_ini_inventory
from gpurig.inventory.loader import load_yaml_inventory
from gpurig.strict.yamlio import parse_yaml, read_text

# ansible's yaml plugin takes these extensions, and a file with none; its ini plugin anything else but .toml
_YAML_SUFFIXES = (".yaml", ".yml", ".json")


def load_inventory(path: str | Path) -> Inventory:
    """Read an Ansible inventory, YAML or INI (plus group_vars/ and host_vars/ beside it).

    hosts.yaml / .yml / .json are YAML; hosts.ini (or any other extension) is
    INI; a file with no extension is YAML when it reads as a YAML mapping, else
    INI, as Ansible tries its yaml plugin before its ini plugin.
    """
    path = Path(path)
    if path.suffix in _YAML_SUFFIXES:
        return load_yaml_inventory(path)
    if path.suffix == ".toml":
        raise InventoryError(f"{path}: TOML inventories are not read by gpurig", "write it as YAML (hosts.yaml) or INI (hosts.ini)")
    text = read_text(path, error=InventoryError, what="inventory", fix_missing="pass --inventory PATH or create inventory/hosts.yaml")
    if not path.suffix:
        try:
            data = parse_yaml(text, path, error=InventoryError)
        except InventoryError:
            data = None  # not YAML: INI, as in Ansible
        if isinstance(data, dict):
            return load_yaml_inventory(path, data)
    return load_ini_inventory(path, text)
