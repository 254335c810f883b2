//! The contract (`docs/contract.md`), shown here so that the rule ids cited
//! across the crate's docs (`S-W5`, `I3`, ...) resolve on docs.rs too.
//! Each rule's anchor is its id in lower case: `contract/index.html#s-w5`.
#![doc = include_str!("../docs/contract.md")]
