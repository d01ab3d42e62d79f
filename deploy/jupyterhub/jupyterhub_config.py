"""JupyterHub for one minengine class: instructors grade with nbgrader's formgrader, students get the
assignment list only, and everyone runs the course's own environment (this repository's .venv).

Start it as root (the local-process spawner switches to each user's Linux account):

    MINENGINE_HUB_INSTRUCTORS=alice MINENGINE_HUB_STUDENTS=bob,carol \\
        .venv/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

Everything a department changes is an environment variable below (or an edit here: the authenticator
and spawner are theirs to choose; see deploy/jupyterhub/README.md). tests/test_hub.py starts this very
file with a shared-password authenticator on 127.0.0.1.
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by JupyterHub)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
COURSE_ID = "minengine"  # nbgrader's course id: the exchange folder and the gradebook use it


def _env(name: str, default: str) -> str:
    return os.environ.get(name, "").strip() or default


def _names(name: str) -> list[str]:
    return [u.strip() for u in os.environ.get(name, "").split(",") if u.strip()]


VENV = Path(_env("MINENGINE_HUB_VENV", str(REPO / ".venv")))  # the course's environment, for every user
STATE = Path(_env("MINENGINE_HUB_STATE", "/srv/minengine-hub"))  # hub database, cookie secret (root only)
EXCHANGE = _env("MINENGINE_HUB_EXCHANGE", "/srv/nbgrader/exchange")  # nbgrader's exchange (mode 1777)
INSTRUCTORS = _names("MINENGINE_HUB_INSTRUCTORS")
STUDENTS = _names("MINENGINE_HUB_STUDENTS")
ROLES = HERE / "roles"  # per-role Jupyter config: which nbgrader extensions a user's server loads
PROXY = REPO / "build" / "hub-node" / "node_modules" / ".bin" / "configurable-http-proxy"

# ---- network: the public proxy, the hub behind it, the proxy's API (all on one host here)
c.JupyterHub.ip = _env("MINENGINE_HUB_IP", "127.0.0.1")
c.JupyterHub.port = int(_env("MINENGINE_HUB_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(_env("MINENGINE_HUB_HUB_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(_env('MINENGINE_HUB_PROXY_API_PORT', '8001'))}"
if PROXY.exists():  # installed by deploy/jupyterhub/install_proxy.sh; else configurable-http-proxy on PATH
    c.ConfigurableHTTPProxy.command = [str(PROXY)]
# Production: terminate HTTPS here (or in front of the proxy), e.g.
# c.JupyterHub.ssl_cert = "/etc/letsencrypt/live/hub.example.edu/fullchain.pem"
# c.JupyterHub.ssl_key = "/etc/letsencrypt/live/hub.example.edu/privkey.pem"

# ---- state
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every user's server

# ---- who may log in. Production: PAM (the default here) or the campus SSO (OAuthenticator, LTI, ...).
c.Authenticator.allowed_users = set(INSTRUCTORS) | set(STUDENTS)
c.JupyterHub.authenticator_class = _env("MINENGINE_HUB_AUTHENTICATOR", "pam")
if c.JupyterHub.authenticator_class == "shared-password":  # tests and demos only
    c.SharedPasswordAuthenticator.user_password = os.environ["MINENGINE_HUB_PASSWORD"]
# Course membership as nbgrader reads it on a hub: nbgrader-<course> (students), formgrade-<course>.
c.JupyterHub.load_groups = {
    f"formgrade-{COURSE_ID}": {"users": INSTRUCTORS},
    f"nbgrader-{COURSE_ID}": {"users": INSTRUCTORS + STUDENTS},
}

# ---- an operator's API token (e.g. a test driver or a provisioning script), only when one is given
_token = os.environ.get("MINENGINE_HUB_API_TOKEN", "")
if _token:
    c.JupyterHub.services = [{"name": "course-admin", "api_token": _token}]
    c.JupyterHub.load_roles = [{
        "name": "course-admin",
        "scopes": ["admin:users", "admin:servers", "tokens", "list:users", "read:users", "access:servers"],
        "services": ["course-admin"],
    }]


# ---- every user's server: the course's venv, its role's extensions, the exchange
def _role(spawner) -> str:
    return "instructor" if spawner.user.name in INSTRUCTORS else "student"


c.JupyterHub.spawner_class = "localprocess"  # each user's server runs as their Linux account
c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.args = ["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None",
                  *_names("MINENGINE_HUB_SINGLEUSER_ARGS")]
c.Spawner.environment = {
    # The venv's tools first: notebooks' shell commands, nbgrader's alembic, the kernels.
    "PATH": f"{VENV / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
    # Read before the venv's own config: students lose Create Assignment and the formgrader.
    "JUPYTER_CONFIG_PATH": lambda spawner: str(ROLES / _role(spawner)),
    "MINENGINE_EXCHANGE": EXCHANGE,  # the roles' nbgrader_config.py reads it
    "HF_HUB_OFFLINE": "1",  # the shipped models never need the network; a hub lookup would hang
}
c.Spawner.http_timeout = int(_env("MINENGINE_HUB_SPAWN_TIMEOUT", "120"))  # a busy 2-core box is slow
c.Spawner.start_timeout = int(_env("MINENGINE_HUB_SPAWN_TIMEOUT", "120"))
c.JupyterHub.concurrent_spawn_limit = 100  # a class logging in at the start of a lecture

if not (VENV / "bin" / "jupyterhub-singleuser").exists():
    sys.exit(f"{VENV}/bin/jupyterhub-singleuser is missing: install the course with its hub extra "
             "(make setup, or pip install -e '.[course,hub]')")
