//! The drawing of `cargo xtask arch`, with plotters' SVG backend: the modules in rows, each
//! row given by the module's longest chain of dependencies down to a module that uses none,
//! an arrow for each dependency; below them the daemon and the helpers it starts from its own
//! binary. Placement is computed from the graph, and every step is ordered, so the same tree
//! gives the same bytes.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, anyhow, bail};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::source::{Helper, Tree};

/// The picture's width in pixels; its height follows from what it holds.
const WIDTH: i32 = 1280;
const MARGIN: i32 = 24;
const MODULE_H: i32 = 28;
/// Between one row's boxes and the next row's: room for the arrows to fan out.
const ROW_GAP: i32 = 46;
/// A line of text in a process box.
const LINE: i32 = 17;
/// What one character of the box text takes, about, at `TEXT` (12.9 px sans-serif in SVG).
const CHAR_W: f64 = 7.0;
const TITLE: u32 = 22;
const TEXT: u32 = 16;
const SMALL: u32 = 14;

/// What the drawing says of each helper; the helpers themselves come from main.rs.
struct Role {
    name: &'static str,
    /// What its argument is, as `crius NAME ARG` shows it.
    arg: &'static str,
    job: &'static str,
    /// What it forks in turn, if anything: its name and what it does.
    forks: Option<(&'static str, &'static str)>,
}

const ROLES: &[Role] = &[
    Role {
        name: "monitor",
        arg: "DIR",
        job: "one per container: forks its init, writes its CRI log, records its exit, \
              forks its exec'd commands and serves its attachments",
        forks: Some((
            "the container's init",
            "joins the pod's namespaces, mounts, pivot_root, credentials, seccomp, then \
             execs the container's process",
        )),
    },
    Role {
        name: "pause",
        arg: "CONFIG",
        job: "one per pod: creates the pod's namespaces, applies its sysctls, then holds \
              them, asleep",
        forks: Some((
            "the pod's PID 1",
            "when the pod's containers share one PID namespace",
        )),
    },
    Role {
        name: "lazyfs",
        arg: "DIR",
        job: "one per lazily pulled layer: serves it read-only over FUSE, asking the daemon \
              for each chunk the first time it is read",
        forks: None,
    },
];

fn role(helper: &Helper) -> Result<&'static Role> {
    ROLES.iter().find(|r| r.name == helper.name).ok_or_else(|| {
        anyhow!(
            "src/main.rs dispatches the helper `{}`, which xtask/src/arch/draw.rs's ROLES does \
             not describe: add it there, then run cargo xtask arch",
            helper.name
        )
    })
}

/// Each module's row from the top, and the dependencies that close a circle (drawn against
/// the layering, since no row can hold them).
fn rows(tree: &Tree) -> (BTreeMap<String, usize>, BTreeSet<(String, String)>) {
    // 1 on the current walk, 2 done (its rank known).
    fn rank(
        m: &str,
        tree: &Tree,
        state: &mut BTreeMap<String, u8>,
        ranks: &mut BTreeMap<String, usize>,
        circles: &mut BTreeSet<(String, String)>,
    ) -> usize {
        state.insert(m.to_string(), 1);
        let mut r = 0;
        for dep in tree.uses.get(m).into_iter().flatten() {
            match state.get(dep) {
                Some(1) => {
                    circles.insert((m.to_string(), dep.clone()));
                }
                Some(_) => r = r.max(ranks[dep] + 1),
                None => r = r.max(rank(dep, tree, state, ranks, circles) + 1),
            }
        }
        state.insert(m.to_string(), 2);
        ranks.insert(m.to_string(), r);
        r
    }
    let (mut state, mut ranks, mut circles) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
    for m in &tree.modules {
        if !state.contains_key(m) {
            rank(m, tree, &mut state, &mut ranks, &mut circles);
        }
    }
    let top = ranks.values().copied().max().unwrap_or(0);
    let rows = ranks.into_iter().map(|(m, r)| (m, top - r)).collect();
    (rows, circles)
}

/// The most room a module of a short row gets: rows of two or three spread out, so their
/// arrows do not run in one bundle down the middle, but stay near each other.
const WIDEST_SLOT: f64 = 300.0;

/// Each module's place: the rows' orders, found by moving each module towards the mean place
/// of the modules it is joined to, a few rounds, ties by name; each row spread over the width.
fn order(tree: &Tree, rows: &BTreeMap<String, usize>) -> (Vec<Vec<String>>, BTreeMap<String, f64>) {
    let count = rows.values().copied().max().map_or(0, |r| r + 1);
    let mut layers: Vec<Vec<String>> = vec![Vec::new(); count];
    for m in &tree.modules {
        layers[rows[m]].push(m.clone());
    }
    let place = |layers: &[Vec<String>]| -> BTreeMap<String, f64> {
        let mut x = BTreeMap::new();
        for layer in layers {
            let mid = (layer.len() as f64 - 1.0) / 2.0;
            let spacing = (f64::from(WIDTH - 2 * MARGIN) / layer.len() as f64).min(WIDEST_SLOT);
            for (i, m) in layer.iter().enumerate() {
                x.insert(
                    m.clone(),
                    f64::from(WIDTH) / 2.0 + (i as f64 - mid) * spacing,
                );
            }
        }
        x
    };
    let mut neighbours: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, deps) in &tree.uses {
        for b in deps {
            neighbours.entry(a).or_default().push(b);
            neighbours.entry(b).or_default().push(a);
        }
    }
    let mut x = place(&layers);
    for _ in 0..16 {
        for layer in &mut layers {
            let key = |m: &String| {
                let near = neighbours.get(m.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                if near.is_empty() {
                    x[m]
                } else {
                    near.iter().map(|n| x[*n]).sum::<f64>() / near.len() as f64
                }
            };
            let mut keyed: Vec<(f64, String)> = layer.iter().map(|m| (key(m), m.clone())).collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
            *layer = keyed.into_iter().map(|(_, m)| m).collect();
        }
        x = place(&layers);
    }
    (layers, x)
}

/// Greedy word wrap to `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn drawn<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the architecture: {e:?}")
}

fn text(area: &Area, s: &str, at: (i32, i32), size: u32, h: HPos, style: FontStyle) -> Result<()> {
    let font = ("sans-serif", size)
        .into_font()
        .style(style)
        .color(&BLACK)
        .pos(Pos::new(h, VPos::Center));
    area.draw(&Text::new(s.to_string(), at, font))
        .map_err(drawn)
}

/// A line from `from` to `to` with a head at `to`.
fn arrow(area: &Area, from: (i32, i32), to: (i32, i32), color: RGBAColor) -> Result<()> {
    area.draw(&PathElement::new(vec![from, to], color.stroke_width(1)))
        .map_err(drawn)?;
    let (dx, dy) = (f64::from(to.0 - from.0), f64::from(to.1 - from.1));
    let len = dx.hypot(dy).max(1.0);
    let (ux, uy) = (dx / len, dy / len);
    let back = (f64::from(to.0) - 8.0 * ux, f64::from(to.1) - 8.0 * uy);
    let side = |s: f64| {
        (
            (back.0 - 3.5 * s * uy).round() as i32,
            (back.1 + 3.5 * s * ux).round() as i32,
        )
    };
    let head = vec![to, side(1.0), side(-1.0)];
    // Heads darker than their lines, to tell which box a crowd of arrows ends at.
    let ink = RGBAColor(color.0, color.1, color.2, 0.9);
    area.draw(&Polygon::new(head, ink.filled())).map_err(drawn)
}

/// A box with a border; `fill` is its colour inside.
fn frame(area: &Area, top_left: (i32, i32), size: (i32, i32), fill: RGBColor) -> Result<()> {
    let bottom_right = (top_left.0 + size.0, top_left.1 + size.1);
    area.draw(&Rectangle::new([top_left, bottom_right], fill.filled()))
        .map_err(drawn)?;
    area.draw(&Rectangle::new(
        [top_left, bottom_right],
        RGBColor(60, 70, 90).stroke_width(1),
    ))
    .map_err(drawn)
}

/// The dark colours the arrows take, one per module that uses others, in turn.
const INKS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
    RGBColor(140, 86, 75),
    RGBColor(188, 189, 34),
];

/// Draws the modules from `top` down; where they end.
fn modules(area: &Area, tree: &Tree, top: i32) -> Result<i32> {
    let (rows, circles) = rows(tree);
    let longest = tree.modules.iter().map(|m| m.len()).max().unwrap_or(1);
    let box_w = (longest as f64 * CHAR_W + 22.0).round() as i32;
    let widest = (0..=rows.values().copied().max().unwrap_or(0))
        .map(|r| rows.values().filter(|v| **v == r).count())
        .max()
        .unwrap_or(1);
    let spacing = f64::from(WIDTH - 2 * MARGIN) / widest as f64;
    if spacing < f64::from(box_w) + 12.0 {
        bail!("{widest} modules in one row do not fit {WIDTH} px: widen the drawing");
    }
    let (layers, x) = order(tree, &rows);
    let row_top = |m: &str| top + rows[m] as i32 * (MODULE_H + ROW_GAP);
    let centre = |m: &str| x[m].round() as i32;

    // Each module's arrows leave its bottom edge spread out, ordered by where they go, and
    // arrive on their target's top edge the same way, so they do not meet in one point.
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut into: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, deps) in &tree.uses {
        for b in deps {
            out.entry(a).or_default().push(b);
            into.entry(b).or_default().push(a);
        }
    }
    let by_x = |v: &mut Vec<&str>| v.sort_by(|a, b| x[*a].total_cmp(&x[*b]).then(a.cmp(b)));
    out.values_mut().for_each(by_x);
    into.values_mut().for_each(by_x);
    let spread = |m: &str, i: usize, n: usize| {
        centre(m) - box_w / 2 + ((i + 1) as f64 * f64::from(box_w) / (n + 1) as f64) as i32
    };
    let mut inks = 0;
    for m in &tree.modules {
        let Some(targets) = out.get(m.as_str()) else {
            continue;
        };
        let ink = INKS[inks % INKS.len()].mix(0.55);
        inks += 1;
        for (i, t) in targets.iter().enumerate() {
            let ins = &into[t];
            let j = ins.iter().position(|s| s == m).unwrap_or(0);
            let from_x = spread(m, i, targets.len());
            let to_x = spread(t, j, ins.len());
            if circles.contains(&(m.clone(), t.to_string())) {
                // Against the layering: up from its top to the target's bottom.
                let from = (from_x, row_top(m));
                let to = (to_x, row_top(t) + MODULE_H);
                arrow(area, from, to, RED.to_rgba())?;
            } else {
                let from = (from_x, row_top(m) + MODULE_H);
                arrow(area, from, (to_x, row_top(t)), ink)?;
            }
        }
    }
    for layer in &layers {
        for m in layer {
            frame(
                area,
                (centre(m) - box_w / 2, row_top(m)),
                (box_w, MODULE_H),
                RGBColor(232, 240, 250),
            )?;
            let at = (centre(m), row_top(m) + MODULE_H / 2);
            text(area, m, at, TEXT, HPos::Center, FontStyle::Normal)?;
        }
    }
    let bottom = top + layers.len() as i32 * (MODULE_H + ROW_GAP) - ROW_GAP;
    if !circles.is_empty() {
        let said: Vec<String> = circles.iter().map(|(a, b)| format!("{a} → {b}")).collect();
        let note = format!("red: uses that close a circle ({})", said.join(", "));
        text(
            area,
            &note,
            (MARGIN, bottom + 14),
            SMALL,
            HPos::Left,
            FontStyle::Italic,
        )?;
    }
    Ok(bottom)
}

/// A process box: its title in bold, then its lines.
fn process(
    area: &Area,
    at: (i32, i32),
    size: (i32, i32),
    title: &str,
    lines: &[String],
) -> Result<()> {
    frame(area, at, size, RGBColor(246, 240, 226))?;
    let x = at.0 + 10;
    text(
        area,
        title,
        (x, at.1 + 14),
        TEXT,
        HPos::Left,
        FontStyle::Bold,
    )?;
    for (i, l) in lines.iter().enumerate() {
        let y = at.1 + 14 + LINE * (i as i32 + 1);
        text(area, l, (x, y), TEXT, HPos::Left, FontStyle::Normal)?;
    }
    Ok(())
}

/// The height a process box of `lines` lines under its title takes.
fn process_h(lines: usize) -> i32 {
    LINE * (lines as i32 + 1) + 12
}

/// An arrow between two boxes with what it means beside its middle.
fn labelled(area: &Area, from: (i32, i32), to: (i32, i32), label: &str) -> Result<()> {
    let ink = RGBColor(60, 70, 90).to_rgba();
    arrow(area, from, to, ink)?;
    let mid = ((from.0 + to.0) / 2 + 6, (from.1 + to.1) / 2);
    text(area, label, mid, SMALL, HPos::Left, FontStyle::Italic)
}

/// Draws the processes from `top` down; where they end.
fn processes(area: &Area, helpers: &[Helper], top: i32) -> Result<i32> {
    text(
        area,
        "processes: the daemon and the helpers it starts from its own binary (src/main.rs runs \
         them before any runtime starts)",
        (MARGIN, top),
        TEXT,
        HPos::Left,
        FontStyle::Bold,
    )?;
    let daemon_lines = ["tokio: the CRI socket, the streaming server, metrics".to_string()];
    let daemon_w = 440;
    let daemon_at = (WIDTH / 2 - daemon_w / 2, top + 22);
    let daemon_h = process_h(daemon_lines.len());
    process(
        area,
        daemon_at,
        (daemon_w, daemon_h),
        "crius daemon",
        &daemon_lines,
    )?;

    let n = helpers.len() as i32;
    let gap = 24;
    let helper_w = (WIDTH - 2 * MARGIN - gap * (n - 1)) / n;
    let chars = ((f64::from(helper_w) - 20.0) / CHAR_W) as usize;
    let mut boxes = Vec::new();
    for h in helpers {
        let r = role(h)?;
        let mut lines = wrap(r.job, chars);
        lines.push(format!("runs {}::main", h.runs));
        if !h.spawned_by.is_empty() {
            lines.push(format!("started by {}", h.spawned_by.join(", ")));
        }
        boxes.push((h, r, lines));
    }
    let helper_h = process_h(boxes.iter().map(|b| b.2.len()).max().unwrap_or(0));
    let helper_y = daemon_at.1 + daemon_h + 56;
    let fork_w = helper_w - 60;
    let fork_chars = ((f64::from(fork_w) - 20.0) / CHAR_W) as usize;
    let fork_lines = |r: &Role| r.forks.map(|f| wrap(f.1, fork_chars)).unwrap_or_default();
    let fork_h = process_h(
        boxes
            .iter()
            .map(|b| fork_lines(b.1).len())
            .max()
            .unwrap_or(0),
    );
    let fork_y = helper_y + helper_h + 48;
    let mut bottom = helper_y + helper_h;
    for (i, (h, r, lines)) in boxes.iter().enumerate() {
        let x = MARGIN + i as i32 * (helper_w + gap);
        let from_x = daemon_at.0 + (i as i32 + 1) * daemon_w / (n + 1);
        let from = (from_x, daemon_at.1 + daemon_h);
        labelled(area, from, (x + helper_w / 2, helper_y), "spawns")?;
        let title = format!("crius {} {}", h.name, r.arg);
        process(area, (x, helper_y), (helper_w, helper_h), &title, lines)?;
        if let Some((forked, _)) = r.forks {
            let fx = x + (helper_w - fork_w) / 2;
            let centre = x + helper_w / 2;
            labelled(
                area,
                (centre, helper_y + helper_h),
                (centre, fork_y),
                "forks",
            )?;
            process(area, (fx, fork_y), (fork_w, fork_h), forked, &fork_lines(r))?;
            bottom = fork_y + fork_h;
        }
    }
    Ok(bottom)
}

/// The whole drawing as SVG text.
pub fn svg(tree: &Tree) -> Result<String> {
    // Drawn twice: first to learn the height, then at it (plotters needs the size first).
    let height = draw(tree, None)?.1;
    Ok(draw(tree, Some(height))?.0)
}

fn draw(tree: &Tree, height: Option<i32>) -> Result<(String, i32)> {
    let mut out = String::new();
    let bottom;
    {
        let h = height.unwrap_or(4000);
        let area = SVGBackend::with_string(&mut out, (WIDTH as u32, h as u32)).into_drawing_area();
        area.fill(&WHITE).map_err(drawn)?;
        text(
            &area,
            "crius: its modules and its processes",
            (MARGIN, 24),
            TITLE,
            HPos::Left,
            FontStyle::Bold,
        )?;
        text(
            &area,
            "generated from the code by cargo xtask arch (xtask/src/arch); its unit test fails \
             when this picture is not what the code gives",
            (MARGIN, 48),
            SMALL,
            HPos::Left,
            FontStyle::Normal,
        )?;
        text(
            &area,
            "modules: those of src/lib.rs, an arrow where one uses another (crate::X), each \
             row by its longest chain of uses down to a module that uses none",
            (MARGIN, 76),
            TEXT,
            HPos::Left,
            FontStyle::Bold,
        )?;
        let modules = modules(&area, tree, 98)?;
        bottom = processes(&area, &tree.helpers, modules + 54)? + MARGIN;
        area.present().map_err(drawn)?;
    }
    Ok((out, bottom))
}
