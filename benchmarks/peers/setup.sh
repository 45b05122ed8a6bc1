#!/usr/bin/env bash
# Creates benchmarks/peers/.venv: RLlib (the main environment's Ray version), Stable-Baselines3 and SB3-contrib for the
# peer benchmarks. They get their own virtualenv because RLlib pins an older gymnasium than flowrl's.
#
# Usage: bash benchmarks/peers/setup.sh        (PYTHON=/path/to/python to pick the main environment's Python)
# Then:  python -m benchmarks ppo dqn --quick  (or benchmarks/peers/.venv/bin/python benchmarks/peers/sb3_ppo.py)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
ray_version="$("$python" -c 'import ray; print(ray.__version__)')"  # match the Ray that flowrl runs on
venv="$here/.venv"

"$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
"${pip[@]}" torch==2.13.0  # first, pinned: the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
"${pip[@]}" "ray[rllib]==$ray_version" stable-baselines3 sb3-contrib ale-py opencv-python-headless  # pip picks the gymnasium all accept (ale-py and OpenCV: RLlib's Atari runs)
"$venv/bin/python" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in ("torch", "ray", "stable-baselines3", "sb3-contrib", "gymnasium", "numpy", "ale-py")))
PY
