//! Compiles libmemcolo's adaptive subrelease decisions (`alloc/src/subrelease.c`, the
//! same file the allocator links) into memcolo-sim, for `memcolo_sim::subrelease`.
fn main() {
    let src = "../../alloc/src/subrelease.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-changed=../../alloc/src/subrelease.h");
    cc::Build::new()
        .file(src)
        .include("../../alloc/src")
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .compile("memcolo_subrelease");
}
