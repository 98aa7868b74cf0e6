//! `upcc`: reproduce the ECI-PP paper's experiments through a content-addressed pipeline.

fn main() {
    std::process::exit(upcc::main_entry());
}
