//! Plan files: load and check; whatever loads is checked and simulated on
//! a full mesh; none of it may panic or hang.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(plan) = ferrocoll_core::ExecutionPlan::from_json(text) else {
        return;
    };
    let _ = plan.check();
    let n = plan.world_size.min(64) as usize;
    let mut t = ferrocoll_topo::Topology::new("mesh", "every pair linked");
    for i in 0..n {
        t.add_node(ferrocoll_topo::Node::new(format!("GPU{i}"), ferrocoll_topo::NodeKind::Gpu));
    }
    for a in 0..n {
        for b in a + 1..n {
            let kind = ferrocoll_topo::LinkKind::Nvlink { generation: 4, count: 1 };
            t.connect_with(a, b, kind, 50.0, 1.0);
        }
    }
    let _ = ferrocoll_topo::sim::simulate_plan(&plan, &t, &Default::default());
});
