"""The team's web page: a local HTTP server that shows what the library reads, as the CLI shows it.

webauth (the token, the cookie, the Host check, the security headers: who
gets an answer), history (verify verdicts, rollouts, builds and promotions
from the records gpurig keeps on disk), snapshot (what the page shows, as
JSON, from facts, the monitor's Run, JobViews and history), containernames
(the names of the containers holding GPUs, from each host's engine), feeds (the
background readers that keep those fresh: facts, one monitor session, the
job queue, the records), webserver (the HTTP server, its snapshot endpoint
and its server-sent events). The page itself (HTML, CSS, JS) is package
data under static/: no CDN, no framework.
"""

from gpurig.errors import GpurigError


class DashboardError(GpurigError):
    """A dashboard that cannot start: an address it must not serve on, a port it cannot take, its page missing."""
