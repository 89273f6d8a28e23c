//! Non-negative least squares (Lawson & Hanson, "Solving Least Squares
//! Problems", 1974, the active-set method), on the normal equations: the
//! regressions of the trained-physics fit and of a step table.

/// Non-negative least squares `min ‖A x − b‖, x ≥ 0` from the normal
/// equations `G = AᵀA`, `c = Aᵀb` (Lawson & Hanson's active-set method).
pub fn nnls(g: &[Vec<f64>], c: &[f64]) -> Vec<f64> {
    let n = c.len();
    let mut x = vec![0.0; n];
    let mut passive = vec![false; n];
    let solve = |set: &[usize]| -> Vec<f64> {
        // Gaussian elimination on the passive sub-system, with a tiny ridge
        // for collinear columns.
        let m = set.len();
        let mut a: Vec<Vec<f64>> = set
            .iter()
            .map(|&i| {
                let mut row: Vec<f64> = set.iter().map(|&j| g[i][j]).collect();
                row.push(c[i]);
                row
            })
            .collect();
        for (k, row) in a.iter_mut().enumerate() {
            row[k] += 1e-10 * (1.0 + row[k].abs());
        }
        for col in 0..m {
            let piv = (col..m)
                .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
                .unwrap_or(col);
            a.swap(col, piv);
            let p = a[col][col];
            if p.abs() < 1e-300 {
                continue;
            }
            let pivot_row = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col] / p;
                    if f != 0.0 {
                        for (v, pv) in row.iter_mut().zip(&pivot_row).skip(col) {
                            *v -= f * pv;
                        }
                    }
                }
            }
        }
        (0..m)
            .map(|k| {
                if a[k][k].abs() < 1e-300 {
                    0.0
                } else {
                    a[k][m] / a[k][k]
                }
            })
            .collect()
    };
    for _ in 0..(3 * n + 10) {
        // Gradient of ½‖Ax − b‖²: w = c − G x.
        let w: Vec<f64> = (0..n)
            .map(|i| c[i] - (0..n).map(|j| g[i][j] * x[j]).sum::<f64>())
            .collect();
        let Some(t) = (0..n)
            .filter(|&i| !passive[i] && w[i] > 1e-12 * (1.0 + c[i].abs()))
            .max_by(|&i, &j| w[i].total_cmp(&w[j]))
        else {
            break;
        };
        passive[t] = true;
        loop {
            let set: Vec<usize> = (0..n).filter(|&i| passive[i]).collect();
            let z = solve(&set);
            if z.iter().all(|&v| v > 0.0) {
                for (k, &i) in set.iter().enumerate() {
                    x[i] = z[k];
                }
                break;
            }
            let mut alpha = f64::INFINITY;
            for (k, &i) in set.iter().enumerate() {
                if z[k] <= 0.0 {
                    alpha = alpha.min(x[i] / (x[i] - z[k]));
                }
            }
            for (k, &i) in set.iter().enumerate() {
                x[i] += alpha * (z[k] - x[i]);
                if x[i] <= 1e-12 {
                    x[i] = 0.0;
                    passive[i] = false;
                }
            }
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nnls_solves_a_small_problem_with_an_active_bound() {
        // A = [[1, 0], [0, 1], [1, 1]], b = [1, -1, 0]: unconstrained
        // x = (1, -1); with x ≥ 0, x = (0.5, 0).
        let a = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
        let b = [1.0, -1.0, 0.0];
        let mut g = vec![vec![0.0; 2]; 2];
        let mut c = vec![0.0; 2];
        for (row, y) in a.iter().zip(b) {
            for i in 0..2 {
                c[i] += row[i] * y;
                for j in 0..2 {
                    g[i][j] += row[i] * row[j];
                }
            }
        }
        let x = nnls(&g, &c);
        assert!((x[0] - 0.5).abs() < 1e-9 && x[1] == 0.0, "{x:?}");
        // A positive solution is the least-squares one.
        let x = nnls(&[vec![2.0, 0.0], vec![0.0, 4.0]], &[2.0, 2.0]);
        assert!(
            (x[0] - 1.0).abs() < 1e-9 && (x[1] - 0.5).abs() < 1e-9,
            "{x:?}"
        );
    }
}
