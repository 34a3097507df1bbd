"""python -m fasttrain.doctor [--json]: does the environment fit together? (tools/doctor.py)"""

import sys

from fasttrain.tools.doctor import main

if __name__ == "__main__":
    sys.exit(main())
