"""The files: GGUF packs (read, checked, made), the architectures' tensor tables, dumps and
records, and the atomic writes, progress lines and cache folder every reader and writer shares."""
