"""Building images: the spec, compat tables, render, quoting, lint, base images, BuildKit builds, the local docker CLI."""
