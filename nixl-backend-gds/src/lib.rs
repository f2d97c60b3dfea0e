//! nixl-backend-gds (skeleton; filled by its issue).
