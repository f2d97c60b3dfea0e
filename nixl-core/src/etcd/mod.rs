//! Metadata exchange through etcd (feature `etcd`).
