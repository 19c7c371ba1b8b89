"""`python -m nearlocal`: the same command line as `nearlocal`."""

import sys

from nearlocal.frontends.entry import main

sys.exit(main())
