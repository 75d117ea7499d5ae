"""Optional dependencies by extra (pyproject.toml): the one-line error that names the extra a feature needs."""

from __future__ import annotations

DISTRIBUTION = "flywheel-rl"
EXTRAS = {  # extra: the packages it adds, as the error names them
    "mario": "nes-py, gym-super-mario-bros",
    "atari": "ale-py",
    "metta": "mettagrid",
    "video": "imageio-ffmpeg, Pillow, pygame",
    "track": "wandb",
    "export": "onnx, onnxscript, onnxruntime",
}


class MissingExtra(ImportError):
    """A feature whose optional dependencies are not installed; the message names the extra to install."""

    def __init__(self, extra: str, feature: str, cause: BaseException | None = None) -> None:
        if extra not in EXTRAS:
            raise ValueError(f"unknown extra {extra!r}")
        because = f" ({str(cause).splitlines()[0]})" if cause is not None and str(cause).strip() else ""
        super().__init__(f"{feature} needs the {extra} extra ({EXTRAS[extra]}): "
                         f"pip install '{DISTRIBUTION}[{extra}]'{because}")
        self.extra = extra
