"""Every `fab` task, by the module that holds it.

fabfile.py only parses flags and calls these; they take plain arguments, so tests and
bench/launch.py call them directly. Each task resolves --cluster, opens a Session on its nodes
(launcher.session: connected once, probed once) and runs its steps on every node at once.
"""

from launcher.checkpoints import fetch, sample
from launcher.console import TaskError
from launcher.data.prepare import prepare_data
from launcher.doctor import doctor
from launcher.launch.logs import logs
from launcher.launch.status import status
from launcher.launch.stop import stop
from launcher.runs.cost import cost
from launcher.setup.ready import setup
from launcher.train import train

__all__ = ["TaskError", "cost", "doctor", "fetch", "logs", "prepare_data", "sample", "setup", "status", "stop", "train"]
