//! Which ps task holds which variable. Computed, not negotiated: every process
//! derives the same answer from the config, as `replica_device_setter` does.

use crate::config::Placement;
use crate::model::VarSpec;

/// The ps task index of each variable, in `vars` order.
pub fn assign(vars: &[VarSpec], num_ps: usize, strategy: Placement) -> Vec<usize> {
    assert!(num_ps > 0, "a cluster has at least one ps task (validated in config)");
    match strategy {
        Placement::RoundRobin => (0..vars.len()).map(|i| i % num_ps).collect(),
        Placement::Greedy => {
            // Largest first onto the least-loaded ps; ties by index so all agree.
            let mut order: Vec<usize> = (0..vars.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(vars[i].shape.iter().product::<usize>()));
            let mut load = vec![0usize; num_ps];
            let mut out = vec![0; vars.len()];
            for i in order {
                let ps = (0..num_ps).min_by_key(|&p| (load[p], p)).unwrap_or(0);
                load[ps] += vars[i].shape.iter().product::<usize>();
                out[i] = ps;
            }
            out
        }
    }
}

/// The variables held by ps task `ps`, in model order.
pub fn shard(vars: &[VarSpec], num_ps: usize, strategy: Placement, ps: usize) -> Vec<VarSpec> {
    assign(vars, num_ps, strategy)
        .into_iter()
        .zip(vars)
        .filter(|(p, _)| *p == ps)
        .map(|(_, v)| v.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs() -> Vec<VarSpec> {
        [("layer1/weights", vec![784, 500]), ("layer1/biases", vec![500]), ("layer2/weights", vec![500, 10]), ("layer2/biases", vec![10])]
            .into_iter()
            .map(|(n, s)| VarSpec { name: n.into(), shape: s })
            .collect()
    }

    #[test]
    fn round_robin_in_creation_order() {
        assert_eq!(assign(&specs(), 2, Placement::RoundRobin), vec![0, 1, 0, 1]);
        assert_eq!(assign(&specs(), 3, Placement::RoundRobin), vec![0, 1, 2, 0]);
        assert_eq!(shard(&specs(), 2, Placement::RoundRobin, 1)[0].name, "layer1/biases");
    }

    #[test]
    fn greedy_balances_bytes() {
        assert_eq!(assign(&specs(), 2, Placement::Greedy), vec![0, 1, 1, 1]);
    }
}
