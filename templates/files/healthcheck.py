"""Docker HEALTHCHECK of gpurig's Jupyter images: the server answers /api (no token needed there)."""

import ssl
import sys
import urllib.request
from pathlib import Path

tls = Path("/run/secrets/jupyter_cert.pem").is_file()
url = f"{'https' if tls else 'http'}://127.0.0.1:8888/api"
context = ssl._create_unverified_context() if tls else None  # our own cert, on loopback
try:
    with urllib.request.urlopen(url, timeout=4, context=context) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as err:
    print(f"jupyter not answering at {url}: {err}", file=sys.stderr)
    sys.exit(1)
