"""Ansible-format inventory (YAML or INI) -> ``Host`` objects, loaded in bounded, linear work with strict values.

The file format is Ansible's YAML inventory (``all`` / ``children`` / ``hosts`` /
``vars``) or its INI inventory (``[group]``, ``[group:children]``,
``[group:vars]``; gpurig/inventory/ini.py), chosen as Ansible chooses
(gpurig/inventory/source.py), so an inventory a team already has works
unchanged. Variables are merged with Ansible's precedence, lowest first:

1. group vars from the inventory file: ``all``, then parents before children,
   siblings by ``ansible_group_priority`` then name (the later wins);
2. ``group_vars/all.yml`` beside the inventory, then ``group_vars/<group>.yml``
   in the same group order;
3. host vars from the inventory file;
4. ``host_vars/<host>.yml`` beside the inventory.

What Ansible would accept silently is refused here, each with one line naming
the file, the key path and the rule: a host listed twice in one group (also
through a range), one host given two different values for a var, a port that
is ``true`` or ``22.9``, a host name, address or user that a shell or ssh could
act on, ranges past ``hostrange.MAX_NAMES_PER_PATTERN`` names and inventories past
``MAX_HOSTS``. Every file is read through :mod:`gpurig.strict.yamlio`.
"""

from gpurig.inventory.hostgroups import Group, Host, Inventory
from gpurig.inventory.hostrange import expand_host_pattern
from gpurig.inventory.loader import MAX_HOSTS
from gpurig.inventory.source import load_inventory

__all__ = ["Group", "Host", "Inventory", "MAX_HOSTS", "expand_host_pattern", "load_inventory"]
