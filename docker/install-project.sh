#!/bin/sh
# Install the flywheel-rl wheel into /opt/venv (runtime stage of docker/Dockerfile, as root), then check the
# flavor: services must pass `pip check` and import every service; actor (trimmed by slim-venv.sh, so
# `pip check` would list what was removed on purpose) must import the actor and the environments it runs.
#
#   install-project.sh FLAVOR WHEEL_DIR
set -eu
flavor=$1
wheels=$2
venv=/opt/venv
python="$venv/bin/python"

"$python" -m pip install --no-deps --no-index "$wheels"/flywheel_rl-*.whl
rm -rf "$wheels"
cd /
case "$flavor" in
    services)
        "$python" -m pip check
        "$python" -c 'import flywheel.services.actor.main, flywheel.services.replay.main, flywheel.services.learner.main'
        "$python" -c 'import flywheel.services.gateway.app'
        "$venv/bin/flywheel" --help >/dev/null
        ;;
    actor)
        "$python" -c 'import flywheel.services.actor.main, cv2, nes_py, gym_super_mario_bros, ale_py'
        # build what an actor of the default job builds (Mario's envs, the frozen conv policy) without the packages
        # slim-venv.sh removed: an import of one of them on that path is an error here, not in a running container
        "$python" -c 'from flywheel.launch.registry import settings_class; from flywheel.launch.runplan import DEFAULT_ENV
from flywheel.services.actor.startup import build_acting
core, spec = build_acting(settings_class("actor")(env_id=DEFAULT_ENV, num_envs=2, preset="pixel"))
print("install-project: an actor of", DEFAULT_ENV, "builds", spec.obs_shape)'
        "$venv/bin/flywheel" actor --help >/dev/null
        ;;
    *)
        echo "install-project: unknown FLAVOR '$flavor' (services or actor)" >&2
        exit 2
        ;;
esac
echo "install-project: flywheel-rl ($flavor) installed in $venv"
