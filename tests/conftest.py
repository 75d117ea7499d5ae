"""Every test starts without a preset: settings built in the test process take their fields' defaults unless the
test names a preset (tests/test_presets.py does); `flywheel run` passes its preset's values to its children."""

import os

os.environ["FLYWHEEL_PRESET"] = "none"
