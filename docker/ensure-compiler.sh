#!/bin/sh
# Give the services image what torch.compile needs on a CPU: a C++ compiler (g++) and the headers of the Python
# that made /opt/venv (run as root in the runtime stage of docker/Dockerfile). The learner's inductor backend
# compiles its kernels with them; without them torch.compile fails and the learner trains eagerly (slower).
# The actor flavor never compiles: nothing is installed. python:3.11-slim ships Python's headers, so it gets g++
# only; a Debian/Ubuntu python3 gets python3-dev too. A base that already has both (the debootstrap base of the
# offline builds) installs nothing, so no package index is needed then.
set -eu
flavor=$1
if [ "$flavor" = actor ]; then
    echo "ensure-compiler: the actor image compiles nothing"
    exit 0
fi
include=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
missing=""
command -v g++ >/dev/null 2>&1 || missing="g++"
[ -f "$include/Python.h" ] || missing="$missing python3-dev"
if [ -z "$missing" ]; then
    echo "ensure-compiler: $(g++ --version | head -n 1) and $include/Python.h are there"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-compiler: BASE_IMAGE lacks$missing and has no apt-get to install it" >&2
    exit 1
fi
echo "ensure-compiler: installing$missing with apt"
apt-get update
# shellcheck disable=SC2086  # one package name per word
apt-get install -y --no-install-recommends $missing
rm -rf /var/lib/apt/lists/*
g++ --version | head -n 1
test -f "$include/Python.h"
