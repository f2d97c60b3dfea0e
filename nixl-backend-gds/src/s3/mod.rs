//! S3 objects: in progress.
