//! Records build facts for `ferrocoll --version`. CUDA kernel sources join
//! this script with the CUDA executor.

fn main() {
    for key in ["TARGET", "PROFILE"] {
        let value = std::env::var(key).unwrap_or_else(|_| "unknown".to_owned());
        println!("cargo:rustc-env=FERROCOLL_BUILD_{key}={value}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
