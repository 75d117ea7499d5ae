#!/bin/sh
# Trim /opt/venv for one image flavor (the "venv" stage of docker/Dockerfile).
#
#   services: everything flywheel-rl needs stays. Removed: the C++ test programs and protoc that torch wheels
#             ship in torch/test and torch/bin (~130 MB that nothing runs; torch_shm_manager stays).
#   actor:    the same, plus the packages in docker/actor-excludes.txt and torch's C++ headers and CMake files
#             (only torch.compile and extension builds read them). install-project.sh then checks that an
#             actor still imports and parses its flags.
set -eu
flavor=$1
venv=/opt/venv
python="$venv/bin/python"
site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

before=$(du -sm "$venv" | cut -f1)
rm -rf "$site/torch/test"
find "$site/torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} +

case "$flavor" in
    services)
        ;;
    actor)
        # shellcheck disable=SC2046  # one package name per line
        "$python" -m pip uninstall --yes $(grep -v -e '^#' -e '^[[:space:]]*$' docker/actor-excludes.txt)
        rm -rf "$site/torch/include" "$site/torch/share"
        ;;
    *)
        echo "slim-venv: unknown FLAVOR '$flavor' (services or actor)" >&2
        exit 2
        ;;
esac
echo "slim-venv: $flavor venv $before MB -> $(du -sm "$venv" | cut -f1) MB"
