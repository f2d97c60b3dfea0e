//! Talking to peers outside a transfer: notifications, the side channel (metadata exchange,
//! fetch futures), succession of a name to the next incarnation.

mod notify;
pub(crate) mod sidechannel;
pub(crate) mod succession;
