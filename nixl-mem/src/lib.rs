//! nixl-mem (skeleton; filled by its issue).
