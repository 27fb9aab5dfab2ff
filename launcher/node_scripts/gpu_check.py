"""What a GPU node's driver and torch say, as one Python literal line:

    python - < gpu_check.py

The driver: `nvidia-smi -L` lists the GPUs, and its header names the newest CUDA the driver runs
("CUDA Version: 13.0"). The node environment's torch: its CUDA build (torch.version.cuda, None for
a CPU build), how many GPUs it sees, and those it has no kernels for (a CUDA 13 build has none for
V100 or P100). Each part that fails says why in its own field instead, so
`fab doctor` names the one that is wrong. Imports torch, unlike the other node scripts: it asks the
node environment itself.
"""

import re
import subprocess
from typing import Any

SMI_TIMEOUT_S = 20


def nvidia_smi(*args: str) -> tuple[str, str]:
    """(stdout, '') or ('', why not)."""
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except FileNotFoundError:
        return "", "nvidia-smi not found"
    except (OSError, subprocess.TimeoutExpired) as e:
        return "", f"nvidia-smi failed: {e}"
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()
        return "", f"nvidia-smi exited {done.returncode}: {last[-1] if last else 'no output'}"
    return done.stdout, ""


def driver() -> dict:
    listing, error = nvidia_smi("-L")
    gpus = [line.split(":", 1)[1].split("(UUID")[0].strip() for line in listing.splitlines() if line.startswith("GPU ")]
    found: dict = {"gpus": gpus, "driver_error": error}
    if not error:
        header, _ = nvidia_smi()
        version = re.search(r"CUDA Version:\s*(\d+\.\d+)", header)
        found["driver_cuda"] = version.group(1) if version else ""
    return found


def torch_facts() -> dict:
    try:
        import torch
    except Exception as e:  # a broken install raises more than ImportError
        return {"torch_error": f"import torch failed: {type(e).__name__}: {e}"}
    found: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda or "", "devices": 0, "torch_error": ""}
    if torch.version.cuda:
        try:
            found["devices"] = devices = torch.cuda.device_count()
        except Exception as e:
            found["torch_error"] = f"torch.cuda.device_count() failed: {type(e).__name__}: {e}"
            return found
        try:
            found["built_for"], found["unsupported"] = kernels(torch, devices)
        except Exception as e:  # a report without the kernels' verdict rather than none
            found["built_for"] = f"unknown ({type(e).__name__}: {e})"
    return found


def kernels(torch: Any, devices: int) -> tuple[str, list[str]]:
    """(the architectures this torch build has kernels for, the GPUs it has none for), as torch's own
    check at its CUDA start judges (torch.cuda._check_capability); where a torch lacks that helper, a
    GPU runs an sm_ build of its major capability up to its own, or a compute_ (PTX) one up to it."""
    built_for = list(torch.cuda.get_arch_list())
    judge = getattr(torch.cuda, "_code_compatible_with_device", None)

    def runs(device_cc: int, arch: str) -> bool:
        kind, _, digits = arch.partition("_")
        code_cc = int(digits.rstrip("af"))
        if judge is not None:
            return bool(judge(device_cc, code_cc))
        return code_cc <= device_cc and (kind == "compute" or code_cc // 10 == device_cc // 10)

    known = [a for a in built_for if a.partition("_")[2].rstrip("af").isdigit()]
    unsupported = []
    for index in range(devices):
        major, minor = torch.cuda.get_device_capability(index)
        if known and not any(runs(10 * major + minor, arch) for arch in known):
            unsupported.append(f"{torch.cuda.get_device_name(index)} (capability {major}.{minor})")
    return " ".join(built_for), unsupported


if __name__ == "__main__":
    print(repr({**driver(), **torch_facts()}), flush=True)
