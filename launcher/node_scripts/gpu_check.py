"""What a GPU node's driver and torch say, as one Python literal line:

    python - < gpu_check.py

The driver: `nvidia-smi -L` lists the GPUs, and its header names the newest CUDA the driver runs
("CUDA Version: 13.0"). The node environment's torch: its CUDA build (torch.version.cuda, None for
a CPU build) and how many GPUs it sees. Each part that fails says why in its own field instead, so
`fab doctor` names the one that is wrong. Imports torch, unlike the other node scripts: it asks the
node environment itself.
"""

import re
import subprocess

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
    found = {"torch": torch.__version__, "torch_cuda": torch.version.cuda or "", "devices": 0, "torch_error": ""}
    if torch.version.cuda:
        try:
            found["devices"] = torch.cuda.device_count()
        except Exception as e:
            found["torch_error"] = f"torch.cuda.device_count() failed: {type(e).__name__}: {e}"
    return found


if __name__ == "__main__":
    print(repr({**driver(), **torch_facts()}), flush=True)
