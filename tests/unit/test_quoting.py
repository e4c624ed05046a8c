"""Quoting filters and the seal: a value reaches a rendered file only quoted for where it lands."""

import shlex
from pathlib import Path

import jinja2
import pytest

from gpurig.errors import RenderError
from gpurig.image import quoting
from gpurig.image.render import environment, render
from gpurig.image.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ['"', "'", "$(id)", "`id`", "#", "\\", "${HOME}", " ; rm -rf / ", "a b"]


def buildkit_double_quoted(text: str) -> str:
    """What BuildKit's lexer makes of one "..." word (shell/lex.go processDoubleQuote): \\ escapes only \\, " and $."""
    assert text[0] == '"' and text[-1] == '"'
    out, i, body = [], 0, text[1:-1]
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in '"$\\':
            out.append(body[i + 1])
            i += 2
            continue
        assert ch not in '"$', f"unescaped {ch!r} in {text!r}"
        out.append(ch)
        i += 1
    return "".join(out)


@pytest.mark.parametrize("payload", HOSTILE)
def test_sh_and_dq_give_back_the_value_as_one_word(payload):
    value = f"pre{payload}post"
    assert shlex.split(quoting.sh(quoting.Sealed(value))) == [value]
    assert buildkit_double_quoted(quoting.dq(quoting.Sealed(value))) == value
    assert shlex.split(quoting.sh([quoting.Sealed(value), "numpy", 22])) == [value, "numpy", "22"]


@pytest.mark.parametrize("value", ["a\nRUN id", "a\rb", "a\x00b", "x\x1b[2J"])
@pytest.mark.parametrize("name", ["sh", "dq", "word"])
def test_no_filter_writes_a_line_break_or_control_character(name, value):
    with pytest.raises(RenderError, match="line break or control character"):
        quoting.FILTERS[name](quoting.Sealed(value))


@pytest.mark.parametrize("value", [*HOSTILE, "debian:bookworm slim"])
def test_word_refuses_anything_a_parser_could_act_on(value):
    with pytest.raises(RenderError, match="cannot stand unquoted"):
        quoting.word(quoting.Sealed(f"debian{value}"))
    assert quoting.word(quoting.Sealed("registry.example.com:5000/ml/base@sha256:ab12")) == "registry.example.com:5000/ml/base@sha256:ab12"


@pytest.mark.parametrize(
    "source",
    [
        "{{ value }}",
        "{{ value ~ 'x' }}",
        "{{ items | join(' ') }}",
        "{{ '%s' | format(value) }}",
        "{{ value | string }}",
        "{{ value | upper }}",
        "{{ obj }}",
        "{{ obj.name }}",
        "{{ items }}",
        "{{ {'k': value} }}",
    ],
)
def test_a_sealed_value_never_becomes_text_without_a_filter(source):
    env = jinja2.Environment(finalize=quoting.finalize, undefined=jinja2.StrictUndefined)
    env.filters.update(quoting.FILTERS)
    user = load_spec(ROOT / "images" / "pytorch.yaml").user
    values = {name: quoting.seal(v) for name, v in {"value": "x", "items": ["a", "b"], "obj": user}.items()}
    with pytest.raises((quoting.UnquotedValue, jinja2.UndefinedError)):
        env.from_string(source).render(**values)


def test_sealed_values_still_compare_and_test_like_their_text():
    env = environment(ROOT / "templates")
    template = env.from_string(
        "{% if name == 'gpurig' and flag and not empty %}{{ name | sh }} {{ ports | word }} {{ items | sh }}{% endif %}"
    )
    values = {k: quoting.seal(v) for k, v in {"name": "gpurig", "flag": "x", "empty": "", "ports": (22, 8888), "items": ["a b"]}.items()}
    assert template.render(**values) == "gpurig 22 8888 'a b'"


def test_a_template_that_forgets_the_filter_fails_naming_its_line(project):
    spec = load_spec(project / "images" / "pytorch.yaml")
    template = project / "templates" / "slim.Dockerfile.j2"
    template.write_text(template.read_text().replace("WORKDIR /home/{{ spec.user.name | word }}", "WORKDIR /home/{{ spec.user.name }}"))
    with pytest.raises(RenderError) as err:
        render(spec, spec.default, "slim", project, project / "out")
    assert "slim.Dockerfile.j2 line" in str(err.value) and "| sh" in str(err.value)
    assert not (project / "out" / "pytorch").exists() or not any((project / "out" / "pytorch").iterdir())


def test_the_templates_quote_by_filter_only():
    """No hand quoting left: a value is never wrapped in quotes by the template text around it."""
    for path in (ROOT / "templates").rglob("*.j2"):
        text = path.read_text()
        for quote in ('"{{', "'{{"):
            assert quote not in text, f"{path.name} quotes a value by hand ({quote}...)"


def test_an_ipv6_registry_renders(project):
    spec_file = project / "images" / "pytorch.yaml"
    spec_file.write_text(spec_file.read_text().replace('registry: ""', 'registry: "[::1]:5000/ml"'))
    spec = load_spec(spec_file)
    context = render(spec, spec.default, "slim", project, project / "out")
    assert "# Image: [::1]:5000/ml/pytorch:2.14.1-cu130-slim" in context.dockerfile.read_text()
