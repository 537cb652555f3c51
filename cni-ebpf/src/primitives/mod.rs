//! What every feature builds on, knowing none of them: reading and checking headers
//! ([`packet`]), rewriting them with their checksums ([`csum`]), the clock ([`clock`]),
//! every map of the object ([`maps`]), the node's FIB and MTUs ([`fib`]), handing a
//! frame over ([`deliver`]) once NetworkPolicy lets it in ([`policy`]), counting ([`counters`]), the node's own sockets
//! ([`socket`]), and zeroing without memset ([`zeroed`]).

pub mod clock;
pub mod counters;
pub mod csum;
pub mod deliver;
pub mod fib;
pub mod maps;
pub mod packet;
pub mod policy;
pub mod socket;
pub mod zeroed;
