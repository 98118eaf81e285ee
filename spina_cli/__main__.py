"""`python -m spina_cli` = `spina`."""
import sys

from spina_cli.main import main

sys.exit(main())
