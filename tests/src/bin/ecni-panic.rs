//! Runs the plugin's start-up (the config's cniVersion remembered, the panic hook
//! installed) on the config given on stdin, then panics, as a plugin bug would.

use std::io::Read;

fn main() {
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    cni_plugin::output::remember_version(&stdin);
    cni_plugin::output::install_panic_hook();
    panic!("a deliberate panic, as a bug would");
}
