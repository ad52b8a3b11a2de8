"""Running a test's program as an ordinary user (user-mode demo hosts are for non-root).

When the suite runs as root, `ordinary_user()` makes (once; idempotent) the user
``ddlkituser`` and `user_env(tmp)` gives that user what it needs and cannot read here:
- a Python: the kit's venv interpreter lives under /root (mode 700 on this machine), so a
  venv made from the system's python3.11 (same ABI) that loads the kit's site-packages
  (a ``.pth`` calling ``site.addsitedir``), at a path every host (the same machine) sees;
- the prepared data sets (copied from the session's DDLKIT_HOME), a HOME, a runs dir.
Everything is in ``tmp`` (a directory of its own in /tmp, given to the user). Not root: the
current user is already ordinary and runs the program directly.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

USER = "ddlkituser"
REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3.11"


def ordinary_user() -> pwd.struct_passwd:
    """The ordinary user to run as (root: ``ddlkituser``, made if missing; else oneself)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER], check=True)
        return pwd.getpwnam(USER)


@dataclass(frozen=True)
class UserEnv:
    python: str
    env: dict[str, str]
    runs_dir: Path
    prefix: tuple[str, ...]  # setpriv ... (root) or nothing

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, self.python, *args]


def user_env(tmp: Path, data_home: Path) -> UserEnv:
    """What the ordinary user needs, under ``tmp``; see the module docstring."""
    user = ordinary_user()
    home, runs = tmp / "home", tmp / "runs"
    (home / ".keras").mkdir(parents=True)
    runs.mkdir()
    shutil.copytree(data_home / "datasets", tmp / "ddlkit-home" / "datasets")
    python = sys.executable
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:
        venv = tmp / "venv"
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(sysconfig.get_paths()["purelib"])  # the kit's venv's site-packages
        (venv / "lib" / "python3.11" / "site-packages" / "kit.pth").write_text(
            f"import site; site.addsitedir({str(site)!r})\n"
        )
        python = str(venv / "bin" / "python")
        tmp.chmod(0o755)  # mkdtemp's is 0700
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(tmp)], check=True)
        prefix = ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups")
    env = {
        "PATH": f"{Path(python).parent}:/usr/local/bin:/usr/bin:/bin",  # no sbin, as users have
        "HOME": str(home),
        "USER": user.pw_name,
        "DDLKIT_HOME": str(tmp / "ddlkit-home"),
        "DDLKIT_OFFLINE": "1",
        "DDLKIT_FAST": "1",
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    return UserEnv(python=python, env=env, runs_dir=runs, prefix=prefix)
