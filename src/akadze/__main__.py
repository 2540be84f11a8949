"""``python -m akadze`` runs the command line, as the ``akadze`` script does.

``python -m`` puts the current directory first on ``sys.path``; the script does not.
It is taken off again, so that a file in the current directory cannot shadow an
installed module here either (``akadze worker`` adds the current directory last:
akadze/cli/apps.py).
"""

import os
import sys

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from akadze.cli import main  # after the path fix, by design

main()
