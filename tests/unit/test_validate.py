"""gpurig.strict.validate: each grammar accepts what real files hold and refuses what a shell, ssh or pip could act on."""

from __future__ import annotations

import re

import pytest

from gpurig.strict import validate as v

# Characters that mean something to a shell or to ssh's %-expansion; none may reach one inside a name.
SHELL_SPECIAL = ["$(id)", "`id`", ";", "|", "&", "<", ">", "'", '"', "\\", "%h", "!", "#", "*", "?", "{a,b}", "~"]


@pytest.mark.parametrize(
    "value",
    ["a100-01", "gpu01.example.invalid", "example.com.", "host_with_underscore", "10.0.0.1", "::1", "2001:db8::1", "[fe80::1]", "x" * 63],
)
def test_host_names_and_addresses_people_use(value):
    assert v.hostname_problem(value) is None


@pytest.mark.parametrize("bad", [f"a{s}b" for s in SHELL_SPECIAL] + [s + "host" for s in SHELL_SPECIAL])
def test_host_names_with_shell_specials_are_refused(bad):
    assert v.hostname_problem(bad)


@pytest.mark.parametrize(
    "bad",
    ["", None, 22, "a b", "host\n", "a\nb", "a\tb", "a\x00b", "-oProxyCommand=touch /tmp/x", "-host", "[10.0.0.1]", "[x]",
     "a..b", "x" * 64, "y." * 127 + "y", "héllo", "gpu[01:03]"],
)
def test_host_names_that_are_not_names_are_refused(bad):
    assert v.hostname_problem(bad)


def test_leading_dash_says_why():
    assert "option" in v.hostname_problem("-oProxyCommand=x") and "option" in v.user_problem("-l")


@pytest.mark.parametrize("value", ["ubuntu", "svc.deploy", "a-b_c", "root", "u" * 32])
def test_user_names(value):
    assert v.user_problem(value) is None


@pytest.mark.parametrize("bad", ["", None, 0, "-l", "root;id", "a b", "user\n", "u" * 33, "$(id)", "ops@bastion", ".hidden"])
def test_bad_user_names(bad):
    assert v.user_problem(bad)


@pytest.mark.parametrize("value", [1, 22, 2222, 65535])
def test_ports(value):
    assert v.port_problem(value) is None


@pytest.mark.parametrize("bad", [True, False, 22.9, 22.0, "22", None, 0, -1, 65536, [22]])
def test_ports_are_whole_numbers_in_range_not_bools_or_floats(bad):
    assert v.port_problem(bad)


@pytest.mark.parametrize("value", ["python3", "libc6:amd64", "python3=3.11.2-1", "g++", "libstdc++6", "ca-certificates"])
def test_debian_packages(value):
    assert v.debian_package_problem(value) is None


@pytest.mark.parametrize("bad", ["Python3", "a", "pkg;rm -rf /", "pkg name", "pkg\n", "-foo", "$(id)", "pkg=1.0 other", ""])
def test_bad_debian_packages(bad):
    assert v.debian_package_problem(bad)


@pytest.mark.parametrize("value", ["https://pypi.org/simple", "http://mirror.example:8080/debian", "https://download.pytorch.org/whl/cu130"])
def test_urls(value):
    assert v.url_problem(value) is None


@pytest.mark.parametrize(
    "bad",
    ["ftp://x", "file:///etc/passwd", "https://x y", "https://x/\n", "https://mirror/#e", "--index-url=https://x", "-r /etc/passwd",
     "https://", "https://host:99999/", "https://x/'$(id)'", "", None],
)
def test_bad_urls(bad):
    assert v.url_problem(bad)


def test_url_schemes_can_be_narrowed():
    assert v.url_problem("http://x", schemes=("https",)) == "must start with https://"


@pytest.mark.parametrize(
    "value",
    ["debian:bookworm-slim", "registry.example.com:5000/ml/base:1", "localhost:5000/x", "ubuntu@sha256:" + "a" * 64, "[::1]:5000/img:tag"],
)
def test_image_refs(value):
    assert v.image_ref_problem(value) is None


@pytest.mark.parametrize("bad", ["Debian", "a b", "x:y:z", "img\n", "a" * 256, "img:tag;id", "-img", ""])
def test_bad_image_refs(bad):
    assert v.image_ref_problem(bad)


def test_registries_and_tags():
    assert v.registry_problem("registry.example.com:5000/ml") is None and v.registry_problem("localhost:5000") is None
    for bad in ("https://reg", "reg/ML", "reg\n", "reg name"):
        assert v.registry_problem(bad)
    assert v.tag_problem("2.14.1-cu130-slim") is None
    for bad in (".x", "-x", "a" * 129, "a b", "a\n", ""):
        assert v.tag_problem(bad)


@pytest.mark.parametrize(
    "url,clean",
    [
        ("https://user:token@host/p", "https://host/p"),
        ("https://u@h:8080/x?q#f", "https://h:8080/x?q#f"),
        ("https://u:p@ss@host/", "https://host/"),
        ("https://host/p", "https://host/p"),
        ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
    ],
)
def test_strip_userinfo(url, clean):
    assert v.strip_userinfo(url) == clean


def test_excerpt_is_short_escaped_and_one_line():
    text = v.excerpt("line one\nline two $(id) " * 20)
    assert len(text) <= 40 and "\n" not in text and text.startswith("'") and text.endswith("...'")
    assert v.excerpt("ok") == "'ok'" and v.excerpt(22.9) == "22.9" and v.excerpt(True) == "True"
    assert len(v.excerpt(list(range(100)))) <= 40 and v.excerpt(list(range(100))).endswith("...")


def test_matches_is_whole_string():
    assert v.matches(re.compile(r"[a-z]+"), "abc") and not v.matches(re.compile(r"[a-z]+"), "abc\n")
    assert not v.matches(re.compile(r"[a-z]+"), 5)


def test_excerpt_of_a_huge_number_is_short_and_never_raises():
    from gpurig.strict.validate import excerpt

    assert excerpt(10**5000 - 1) == "a number of about 5000 digits"
    assert excerpt(12345) == "12345"


# --- numbers and outside text: one grammar each -------------------------------------------------


@pytest.mark.parametrize("text", ["²", "١٢", "１２", "12 ", "+1", "-1", "1e3", "", "9" * 19, "0x10"])
def test_a_whole_number_is_ascii_digits_only(text):
    # '²', '١٢' and '１２' pass str.isdigit(); int() raises on '²' and reads the others as 12
    assert v.whole_number(text) is None


def test_whole_numbers_are_read_and_bounded():
    assert v.whole_number("0042") == 42 and v.whole_number(7) == 7
    assert v.whole_number("65536", 65535) is None and v.whole_number(True) is None and v.whole_number(-1) is None


@pytest.mark.parametrize("text", ["1e999", "inf", "nan", "Infinity", "١.٥", "1.5.", "1e", float("inf"), float("nan"), 10**400, True])
def test_a_finite_number_refuses_what_would_overflow_or_is_not_ascii(text):
    assert v.finite_number(text) is None


def test_finite_numbers_are_read():
    assert v.finite_number("0.5") == 0.5 and v.finite_number("1e3") == 1000.0 and v.finite_number("-.5") == -0.5 and v.finite_number(3) == 3.0


def test_printable_shows_every_control_character_and_keeps_the_rest():
    text = "a\x1b[2Jb\x07c\x9bd\u202ee\rf\ng\th é ü 漢"
    shown = v.printable(text)
    assert not any(ord(ch) < 32 or 127 <= ord(ch) < 160 or ch == "\u202e" for ch in shown)
    assert shown == "a\\x1b[2Jb\\x07c\\x9bd\\u202ee\\x0df\\x0ag\\x09h é ü 漢"
    assert v.printable("x\ny\tz\r", newlines=True) == "x\ny\tz\\x0d"
