"""The cells run on every live worker, written out as one script: from trying it to the job.

:class:`Transcript` keeps each cell that ran on every worker without error, in order;
:meth:`Transcript.text` is the script (pure): a docstring with the commands that run it
(``dk.launch.start``, ``ddlkit launch`` and by hand), the Keras choice set before
TensorFlow loads (``TF_USE_LEGACY_KERAS``, as the kit's workers get it), then the cells.
The script needs nothing of ddlkit unless a cell imports it. A cell that is not plain
Python (an IPython magic or ``!`` command) is refused, naming it.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from ddlkit.backend import LEGACY_VAR
from ddlkit.errors import ConfigError

BY_HAND = {
    "multi_worker": (
        "By hand, one shell per worker, each with the same cluster and its own task:\n"
        '    TF_CONFIG=\'{{"cluster": {{"worker": ["localhost:12345", "localhost:12346"]}}, '
        '"task": {{"type": "worker", "index": 0}}}}\' python {path}\n'
        "    (and index 1 in the second shell)"
    ),
    "horovod": "By hand:\n    horovodrun -np 2 -H localhost:2 python {path}",
}


@dataclass
class Transcript:
    """The cells run on every worker of a ``strategy`` job so far."""

    strategy: str
    cells: list[str] = field(default_factory=list)

    def add(self, code: str) -> None:
        self.cells.append(code)

    def text(self, path: str = "SCRIPT.py", workers: int = 2) -> str:
        """The script (pure); ConfigError naming a cell that is not plain Python."""
        if self.strategy not in BY_HAND:
            raise ConfigError(
                f"a {self.strategy} job's live workers run no cells of yours: this notebook is "
                f"the coordinator. Fix: copy the coordinator's cells into a script yourself "
                f"(launch/train_parameter_server.py is one)."
            )
        if not self.cells:
            raise ConfigError(
                "no cell has run on every worker yet, so there is nothing to write. Fix: run "
                "the program's cells with %%px first (a cell on some workers only is left out)."
            )
        for i, cell in enumerate(self.cells, 1):
            try:
                ast.parse(cell)
            except SyntaxError as exc:
                raise ConfigError(
                    f"cell {i} run on the workers is not plain Python ({exc.msg}: "
                    f"{(exc.text or '').strip()!r}), so it cannot go into a script. Fix: "
                    f"run it again without IPython magics or '!' commands, then write the script."
                ) from None
        how = BY_HAND[self.strategy].format(path=path)
        header = (
            f'"""The cells run on every live worker ({self.strategy}), as one script.\n\n'
            f"Launch it as a job:\n"
            f'    dk.launch.start("{path}", strategy="{self.strategy}", workers={workers})\n'
            f"    ddlkit launch --strategy {self.strategy} -n {workers} {path}\n"
            f'{how}\n"""\n\n'
            f"import os\n\n"
            f"# tf-keras (the Keras 2 API) for multi-worker training: before TensorFlow loads.\n"
            f'os.environ.setdefault("{LEGACY_VAR}", "1")\n'
        )
        body = "".join(f"\n# --- cell {i} ---\n{c.strip()}\n" for i, c in enumerate(self.cells, 1))
        return header + body

    def write(self, path: str | os.PathLike, workers: int = 2) -> Path:
        """Write :meth:`text` to ``path`` whole (a temporary file renamed), return the path."""
        path = Path(path)
        text = self.text(str(path), workers)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path
