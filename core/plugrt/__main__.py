import sys

from plugrt.cli import main

sys.exit(main())
