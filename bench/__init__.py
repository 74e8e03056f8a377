"""The benchmark instrument: mqstore against SQLite, LMDB, persist-queue, Redis Streams and a
plain-mmap floor, one process tree, one sitting. See bench/README.md."""
