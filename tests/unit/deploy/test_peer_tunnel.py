"""checks/peer_tunnel.py's cipher choice: AES-GCM first on a CPU with AES instructions, every cipher the client knows still
offered; OpenSSH's own default elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "checks" / "peer_tunnel.py"
_spec = importlib.util.spec_from_file_location("peer_tunnel", SCRIPT)
assert _spec and _spec.loader
tunnel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tunnel)

# `ssh -Q cipher` of Debian 12's OpenSSH 9.2
KNOWN = ["3des-cbc", "aes128-cbc", "aes192-cbc", "aes256-cbc", "aes128-ctr", "aes192-ctr", "aes256-ctr", "aes128-gcm@openssh.com",
         "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com"]
X86 = "processor\t: 0\nflags\t\t: fpu vme sse2 avx2 aes pclmulqdq sha_ni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
NO_AES = "processor\t: 0\nflags\t\t: fpu vme sse2 avx2\n"


def test_a_cpu_with_aes_offers_aes_gcm_first_and_every_default_cipher_after():
    want = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr")
    assert tunnel.preferred_ciphers(X86, KNOWN) == want
    assert tunnel.preferred_ciphers(ARM, KNOWN) == want


def test_without_aes_instructions_or_an_ssh_without_gcm_openssh_chooses():
    assert tunnel.preferred_ciphers(NO_AES, KNOWN) is None
    assert tunnel.preferred_ciphers(X86, [c for c in KNOWN if "gcm" not in c]) is None
    assert tunnel.preferred_ciphers("flags\t\t: fpu aesni_like\n", KNOWN) is None  # a flag that only starts with aes
