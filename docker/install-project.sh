#!/bin/sh
# Install flywheel-rl from /src into /opt/venv without dependencies (install-venv.sh put them there), then check
# that every requirement is met and that each service imports.
set -eu
venv=/opt/venv
python="$venv/bin/python"

"$python" -m pip install --no-deps --no-index --no-build-isolation .
rm -rf build ./*.egg-info
cd /  # check the installed package, not the sources in /src
"$python" -m pip check
"$python" -c 'import flywheel.services.actor.main, flywheel.services.replay.main, flywheel.services.learner.main'
"$python" -c 'import flywheel.services.gateway.app'
"$venv/bin/flywheel" --help >/dev/null
echo "install-project: flywheel-rl installed in $venv"
