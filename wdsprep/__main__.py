from wdsprep.cli import main

raise SystemExit(main())
