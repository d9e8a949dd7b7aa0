"""A pickle that runs code when loaded: the attack safe loading must refuse."""

import os


class RunsCode:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
