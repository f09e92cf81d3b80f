import sys

from rpeg.cli import main

sys.exit(main())
