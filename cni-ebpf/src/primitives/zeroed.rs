//! Zeroing without memset. The BPF backend turns the zeroing of a struct
//! (`mem::zeroed`, a `[0; N]` padding array, several adjacent zero stores, even a copy
//! of a value it knows is zero) into a call to a byte-by-byte memset loop: the 64 bytes
//! of `bpf_fib_lookup` parameters cost some 320 instructions per packet that way.
//! Small padding arrays are therefore written as literals (`[0, 0, 0]`), which stay
//! plain stores, and larger values are zeroed in place by [`Words::zeroed`].

use core::mem::{MaybeUninit, size_of};

/// Room for a `T`, aligned for 8-byte stores.
#[repr(C, align(8))]
pub struct Words<T>(MaybeUninit<T>);

impl<T> Words<T> {
    #[inline(always)]
    pub const fn uninit() -> Self {
        Self(MaybeUninit::uninit())
    }

    /// Zeroes the room in place, 8 bytes at a time, and gives the `T` in it. `T` must be
    /// a plain struct of integers (all-zero is a valid value) whose size is a multiple
    /// of 8. In place: returning the value would copy it, and LLVM turns the copy of a
    /// known-zero value back into a memset.
    #[inline(always)]
    pub fn zeroed(&mut self) -> &mut T {
        const { assert!(size_of::<T>() % 8 == 0) };
        let base = self.0.as_mut_ptr().cast::<u64>();
        for word in 0..size_of::<T>() / 8 {
            // SAFETY: in bounds (the size is a multiple of 8) and aligned (the
            // wrapper). Volatile: plain stores would be merged back into a memset.
            unsafe { base.add(word).write_volatile(0) };
        }
        // SAFETY: every byte is written, and all-zero is a valid `T` (see above).
        unsafe { self.0.assume_init_mut() }
    }
}
