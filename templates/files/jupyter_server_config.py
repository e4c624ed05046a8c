"""JupyterLab settings of gpurig images: a token is always required.

The token, an optional password hash and optional TLS files are read at start
from files the entrypoint prepares; none of them is part of the image.
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821 (provided by Jupyter)

c.ServerApp.ip = "0.0.0.0"
c.ServerApp.port = 8888
c.ServerApp.open_browser = False
c.ServerApp.root_dir = str(Path.home())
c.ServerApp.allow_remote_access = True

token = Path(os.environ.get("GPURIG_JUPYTER_TOKEN_FILE", Path.home() / ".local/share/gpurig/jupyter_token"))
if not token.is_file() or not token.read_text().strip():
    raise SystemExit("gpurig: no Jupyter token file; start the container through gpurig-entrypoint")
c.IdentityProvider.token = token.read_text().strip()

password_hash = Path("/run/secrets/jupyter_password_hash")
if password_hash.is_file():
    c.PasswordIdentityProvider.hashed_password = password_hash.read_text().strip()

cert, key = Path("/run/secrets/jupyter_cert.pem"), Path("/run/secrets/jupyter_key.pem")
if cert.is_file() and key.is_file():
    c.ServerApp.certfile, c.ServerApp.keyfile = str(cert), str(key)
