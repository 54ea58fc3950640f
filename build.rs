//! Link options for the `leaderrun` binary.
//!
//! Packed relative relocations (`-z pack-relative-relocs`, DT_RELR): the table of relative
//! relocations that the dynamic loader reads at every start, in leaderrun and again in its
//! watchdog, shrinks from about 150 KiB to 6 KiB, and with it the resident set of both (see
//! BENCHMARKS.md, Memory). A binary with them needs glibc 2.36 or later to start, so they are
//! used only when building for the machine that builds (as `cargo install` does) and its
//! glibc has them.

/// Whether this machine's glibc, the one a native build links against, knows DT_RELR.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc_knows_relr() -> bool {
    use std::ffi::CStr;
    use std::os::raw::c_char;
    extern "C" {
        fn gnu_get_libc_version() -> *const c_char;
    }
    // SAFETY: glibc returns a static NUL-terminated string such as "2.36".
    let version = unsafe { CStr::from_ptr(gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("")
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (2, 36)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc_knows_relr() -> bool {
    false
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LEADERRUN_NO_RELR");
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target == host
        && target.ends_with("-linux-gnu")
        && std::env::var_os("LEADERRUN_NO_RELR").is_none()
        && glibc_knows_relr()
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
