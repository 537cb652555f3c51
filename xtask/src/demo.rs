pub fn run(_root: &std::path::Path) -> anyhow::Result<()> { todo!() }
