"""Check a prepared dataset against its meta.json: `python - DIR < verify_data.py`.

Prints "ok" and exits 0 when every split file has the recorded size and sha256; otherwise prints
what differs and exits 1.
"""

import hashlib
import json
import os
import sys


def main() -> int:
    directory = sys.argv[1]
    try:
        with open(os.path.join(directory, "meta.json")) as f:
            splits = json.load(f)["splits"]
    except (OSError, ValueError, KeyError) as e:
        print(f"{directory}/meta.json unreadable: {e}")
        return 1
    for name, info in splits.items():
        path = os.path.join(directory, info["file"])
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            print(f"{name}: {e}")
            return 1
        if digest.hexdigest() != info["sha256"]:
            print(f"{name}: {path} sha256 {digest.hexdigest()[:12]} != meta.json {info['sha256'][:12]}")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
