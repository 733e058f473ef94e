#!/usr/bin/env bash
# The GPU rows run in-process on a lent GPU machine whose image has Python 3.12 with torch, numpy, matplotlib,
# pandas, rich, pyyaml, tensorboard, opencv, absl-py and etils, but no gymnasium, ale-py, MuJoCo, SB3 or Ray, and
# no network. This fetches the missing pieces here as Python 3.12 wheels and installs them there.
#
#   benchmarks/device_kit.sh download [DIR]   # here: the wheels into DIR (default .whl, git-ignored; ~12 MB)
#                                             # and name DIR in each call's carry
#   benchmarks/device_kit.sh install [DIR]    # there, first in each call: into /tmp/site; then, in the same
#                                             # command: export PYTHONPATH=/tmp/site:.
#
# Ray is not among them: its wheel alone is larger than what one call may carry, so the rows that need Ray runners
# (TRPO Pong-ram on 8 runners, APPO Pong on 14, two Tune trials on one GPU) stay for a machine with Ray.
set -euo pipefail

# name==version: the versions this project's tests pass with; --no-deps, so each need is named here.
WHEELS=(
  gymnasium==1.4.0 farama-notifications==0.0.6
  ale-py==0.12.1
  mujoco==4.0.0 mujoco-core==4.0.0 mujoco-studio==4.0.0 glfw==2.11.0 pyopengl==3.1.10 websockets==17.4
  stable-baselines3==2.9.2
)

command=${1:-}
dir=${2:-.whl}
case "$command" in
  download)
    mkdir -p "$dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "${WHEELS[@]}"
    du -sh "$dir"
    ;;
  install)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$dir"/*.whl
    ;;
  *)
    echo "usage: $0 download|install [DIR]" >&2
    exit 2
    ;;
esac
