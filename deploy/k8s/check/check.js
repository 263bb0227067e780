#!/usr/bin/env node
// Offline validation of the Kubernetes manifests in deploy/k8s (tests/k8s_test.sh runs it).
//
//   node check.js [--metrics-source FILE]... [--kubectl] DIR_OR_FILE...
//
// For every YAML document found (kustomization.yaml files are rendered instead: their
// resources, then their strategic-merge patches):
//   1. the apiVersion and kind are known: the Kubernetes API (kubernetes-models), the
//      prometheus-operator CRDs, Multus' NetworkAttachmentDefinition, kustomize's Kustomization;
//   2. the document validates against its OpenAPI schema (required fields, types, enums,
//      formats: the JSON schemas kubernetes-models compiles with ajv);
//   3. it has no field its type does not define (a misspelt key is silently ignored by the
//      API server): TypeScript's excess property check of the document as an object literal
//      of the model's interface, which the OpenAPI schemas cannot do (they allow extra keys);
//   4. the documents agree with each other: volumes, Secrets, ConfigMaps and claims exist,
//      selectors select, ports named by a Service or ServiceMonitor exist, the SR-IOV network
//      and its device plugin resource are requested, hugepages are requested as limited and
//      mounted, embedded shell scripts parse (sh -n), PromQL expressions parse and name
//      metrics the daemon exports (the reefline_* names in the --metrics-source files:
//      ifmanager/metrics.cc and ifmanager/if_stats.h).
// With --kubectl, overlays are also rendered by `kubectl kustomize` and must equal this
// script's rendering. Prints "ok: ..."/"FAIL: ..." lines and a final "N passed, N failed".
"use strict";

const fs = require("fs");
const path = require("path");
const os = require("os");
const { execFileSync } = require("child_process");
const YAML = require("yaml");
const ts = require("typescript");

let passed = 0;
let failed = 0;
const ok = (m) => { console.log(`ok: ${m}`); passed++; };
const fail = (m) => { console.log(`FAIL: ${m}`); failed++; };

// ---- arguments ----
const args = process.argv.slice(2);
const metricsSources = [];
let useKubectl = false;
const inputs = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--metrics-source") metricsSources.push(args[++i]);
  else if (args[i] === "--kubectl") useKubectl = true;
  else inputs.push(args[i]);
}
if (!inputs.length) {
  console.error("usage: check.js [--metrics-source FILE]... [--kubectl] DIR_OR_FILE...");
  process.exit(2);
}

// ---- the kinds this deployment may use ----
// apiVersion/kind -> the module whose validate() checks the schema and whose .d.ts has the
// interface I<Kind>. Anything else is an error: a typo in a kind or an apiVersion the
// cluster does not serve (e.g. extensions/v1beta1) is caught here.
const core = (kind) => `kubernetes-models/v1/${kind}`;
const kinds = {
  "v1/Namespace": core("Namespace"),
  "v1/ConfigMap": core("ConfigMap"),
  "v1/Secret": core("Secret"),
  "v1/Service": core("Service"),
  "v1/PersistentVolumeClaim": core("PersistentVolumeClaim"),
  "v1/ServiceAccount": core("ServiceAccount"),
  "apps/v1/DaemonSet": "kubernetes-models/apps/v1/DaemonSet",
  "apps/v1/Deployment": "kubernetes-models/apps/v1/Deployment",
  "batch/v1/Job": "kubernetes-models/batch/v1/Job",
  "batch/v1/CronJob": "kubernetes-models/batch/v1/CronJob",
  "networking.k8s.io/v1/NetworkPolicy": "kubernetes-models/networking.k8s.io/v1/NetworkPolicy",
  "rbac.authorization.k8s.io/v1/Role": "kubernetes-models/rbac.authorization.k8s.io/v1/Role",
  "rbac.authorization.k8s.io/v1/RoleBinding": "kubernetes-models/rbac.authorization.k8s.io/v1/RoleBinding",
  "monitoring.coreos.com/v1/ServiceMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor",
  "monitoring.coreos.com/v1/PrometheusRule": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule",
  "monitoring.coreos.com/v1/PodMonitor": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PodMonitor",
};
// Types of our own for kinds no package models: Multus' CRD (k8s.cni.cncf.io/v1, spec.config
// a CNI configuration as a JSON string) and kustomize's Kustomization (the fields used here).
const localTypes = `
import { IObjectMeta } from "@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta";
export interface INetworkAttachmentDefinition {
  apiVersion: "k8s.cni.cncf.io/v1";
  kind: "NetworkAttachmentDefinition";
  metadata: IObjectMeta;
  spec: { config: string };
}
export interface IKustomization {
  apiVersion: "kustomize.config.k8s.io/v1beta1";
  kind: "Kustomization";
  namespace?: string;
  resources?: string[];
  components?: string[];
  patches?: { path?: string; patch?: string; target?: { group?: string; version?: string; kind?: string; name?: string; namespace?: string } }[];
  images?: { name: string; newName?: string; newTag?: string; digest?: string }[];
  labels?: { pairs: { [k: string]: string }; includeSelectors?: boolean; includeTemplates?: boolean }[];
}
`;
const localKinds = {
  "k8s.cni.cncf.io/v1/NetworkAttachmentDefinition": "INetworkAttachmentDefinition",
  "kustomize.config.k8s.io/v1beta1/Kustomization": "IKustomization",
};

// ---- reading: files, directories, kustomizations ----
// YAML 1.1, as the API server and kubectl read manifests (sigs.k8s.io/yaml): 0400 is octal
// (256), yes/on are booleans. A YAML 1.2 reader would check other values than are applied.
function readDocs(file) {
  const text = fs.readFileSync(file, "utf8");
  const docs = YAML.parseAllDocuments(text, { prettyErrors: true, version: "1.1" });
  const out = [];
  docs.forEach((d, i) => {
    if (d.errors.length) throw new Error(`${file}: document ${i + 1}: ${d.errors[0].message}`);
    if (d.warnings.length) throw new Error(`${file}: document ${i + 1}: ${d.warnings[0].message}`);
    const obj = d.toJS({ maxAliasCount: 0 });
    if (obj !== null && obj !== undefined) out.push({ obj, where: `${file}#${i + 1}` });
  });
  return out;
}

// Strategic merge of the fields pod templates use: lists of objects merge by their
// Kubernetes patch merge key, other lists are replaced, maps merge, null deletes.
const mergeKeys = {
  containers: "name", initContainers: "name", ephemeralContainers: "name", env: "name",
  volumes: "name", volumeMounts: "mountPath", ports: "containerPort", imagePullSecrets: "name",
};
function merge(base, patch, key) {
  if (patch === null) return undefined;
  if (Array.isArray(patch) && Array.isArray(base) && mergeKeys[key]) {
    const k = mergeKeys[key];
    const out = base.map((x) => x);
    for (const p of patch) {
      const at = out.findIndex((x) => x && p && x[k] === p[k]);
      if (at >= 0) out[at] = merge(out[at], p, null);
      else out.push(p);
    }
    return out;
  }
  if (isObject(patch) && isObject(base)) {
    const out = { ...base };
    for (const [k, v] of Object.entries(patch)) {
      const m = merge(base[k], v, k);
      if (m === undefined) delete out[k];
      else out[k] = m;
    }
    return out;
  }
  return patch;
}
const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const idOf = (o) => `${o.kind}/${(o.metadata || {}).namespace || ""}/${(o.metadata || {}).name}`;

function render(dir, seen = new Set()) {
  const kfile = path.join(dir, "kustomization.yaml");
  if (seen.has(kfile)) throw new Error(`${kfile}: cycle`);
  seen.add(kfile);
  const [k] = readDocs(kfile);
  const out = [];
  for (const r of k.obj.resources || []) {
    const p = path.join(dir, r);
    if (!fs.existsSync(p)) throw new Error(`${kfile}: resource ${r} does not exist`);
    if (fs.statSync(p).isDirectory()) out.push(...render(p, seen));
    else out.push(...readDocs(p));
  }
  for (const patch of k.obj.patches || []) {
    if (!patch.path) throw new Error(`${kfile}: only patches with a path are rendered here`);
    for (const pd of readDocs(path.join(dir, patch.path))) {
      const at = out.findIndex((d) => idOf(d.obj) === idOf(pd.obj));
      if (at < 0) throw new Error(`${pd.where}: patches ${idOf(pd.obj)}, which ${kfile} does not have`);
      out[at] = { obj: merge(out[at].obj, pd.obj, null), where: `${out[at].where} + ${pd.where}` };
    }
  }
  if (k.obj.namespace) for (const d of out) if (d.obj.metadata && d.obj.kind !== "Namespace") d.obj.metadata.namespace = k.obj.namespace;
  return out;
}

// Every input: plain YAML files are documents; a directory's kustomization.yaml (and the
// kustomization.yaml of each subdirectory) is a deployment of its own, rendered; the
// kustomization files themselves are checked as documents too.
const units = []; // {name, docs}
const loose = [];
function walk(p) {
  const st = fs.statSync(p);
  if (st.isDirectory()) {
    if (path.basename(p) === "node_modules" || path.basename(p) === "check") return;
    const entries = fs.readdirSync(p).sort();
    if (entries.includes("kustomization.yaml")) {
      try {
        units.push({ name: p, docs: render(p) });
      } catch (e) {
        fail(`render ${p}: ${e.message}`);
      }
      loose.push(...readDocs(path.join(p, "kustomization.yaml")));
      for (const e of entries) {
        const q = path.join(p, e);
        if (fs.statSync(q).isDirectory()) walk(q);
        // Files a kustomization does not list (examples applied on their own) are checked
        // as documents of their own.
        else if (/\.ya?ml$/.test(e) && e !== "kustomization.yaml" && !listed(p, e)) loose.push(...readDocs(q));
      }
      return;
    }
    for (const e of entries) walk(path.join(p, e));
  } else if (/\.ya?ml$/.test(p)) {
    loose.push(...readDocs(p));
  }
}
function listed(dir, file) {
  const [k] = readDocs(path.join(dir, "kustomization.yaml"));
  return (k.obj.resources || []).includes(file) || (k.obj.patches || []).some((x) => x.path === file);
}
for (const i of inputs) {
  try {
    walk(i);
  } catch (e) {
    fail(e.message);
  }
}
// The examples applied on their own (the Job, the Secret's shape) join the deployment they
// belong to for the cross-checks.
const all = [];
for (const u of units) all.push(...u.docs);
all.push(...loose);
const unique = new Map();
for (const d of all) if (!unique.has(d.where)) unique.set(d.where, d);
const documents = [...unique.values()];

// ---- 1 + 2: known kinds, schemas ----
const typed = []; // {where, iface, module, obj}
for (const d of documents) {
  const o = d.obj;
  if (!isObject(o) || typeof o.apiVersion !== "string" || typeof o.kind !== "string") {
    fail(`${d.where}: not a Kubernetes object (apiVersion and kind)`);
    continue;
  }
  const key = `${o.apiVersion}/${o.kind}`;
  const desc = `${d.where} (${o.kind} ${(o.metadata || {}).name || ""})`;
  if (kinds[key]) {
    const mod = require(kinds[key]);
    const Model = mod[o.kind];
    try {
      new Model(o).validate();
      ok(`${desc}: ${key} schema`);
    } catch (e) {
      fail(`${desc}: ${e.message}`);
    }
    typed.push({ desc, module: kinds[key], iface: `I${o.kind}`, obj: o });
  } else if (localKinds[key]) {
    typed.push({ desc, module: null, iface: localKinds[key], obj: o });
    if (o.kind === "NetworkAttachmentDefinition") checkNad(desc, o);
    else ok(`${desc}: ${key}`);
  } else {
    fail(`${desc}: unknown apiVersion/kind ${key}`);
  }
}

function checkNad(desc, o) {
  let c;
  try {
    c = JSON.parse(o.spec.config);
  } catch (e) {
    return fail(`${desc}: spec.config is not JSON: ${e.message}`);
  }
  const problems = [];
  if (typeof c.cniVersion !== "string") problems.push("no cniVersion");
  if (typeof c.type !== "string") problems.push("no CNI plugin type");
  if (c.name !== undefined && c.name !== o.metadata.name) problems.push(`CNI name '${c.name}' is not the object's name`);
  if (c.type === "sriov" && !((o.metadata.annotations || {})["k8s.v1.cni.cncf.io/resourceName"]))
    problems.push("an sriov network needs the k8s.v1.cni.cncf.io/resourceName annotation (the device plugin's resource)");
  problems.length ? fail(`${desc}: ${problems.join("; ")}`) : ok(`${desc}: NetworkAttachmentDefinition, CNI ${c.type} ${c.cniVersion}`);
}

// ---- 3: unknown fields (TypeScript excess property checks) ----
{
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "reefline-k8s-check-"));
  const nm = path.join(__dirname, "node_modules");
  fs.writeFileSync(path.join(dir, "local.ts"), localTypes);
  const lines = [];
  typed.forEach((t, i) => {
    lines.push(t.module ? `import { ${t.iface} as T${i} } from "${t.module}";` : `import { ${t.iface} as T${i} } from "./local";`);
  });
  const first = lines.length;
  typed.forEach((t, i) => lines.push(`export const d${i}: T${i} = ${JSON.stringify(t.obj)};`));
  const file = path.join(dir, "manifests.ts");
  fs.writeFileSync(file, lines.join("\n") + "\n");
  const program = ts.createProgram([file], {
    noEmit: true, strict: true, skipLibCheck: true, types: [],
    moduleResolution: ts.ModuleResolutionKind.Node10, module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2020,
    baseUrl: nm, paths: { "*": ["*"] },
  });
  const byDoc = new Map();
  for (const diag of ts.getPreEmitDiagnostics(program)) {
    const msg = ts.flattenDiagnosticMessageText(diag.messageText, " ");
    if (!diag.file || diag.file.fileName !== file) {
      fail(`TypeScript: ${msg}`);
      continue;
    }
    const line = diag.file.getLineAndCharacterOfPosition(diag.start).line;
    const i = line - first;
    if (i < 0) fail(`TypeScript, importing the models: ${msg}`);
    else byDoc.set(i, [...(byDoc.get(i) || []), msg]);
  }
  typed.forEach((t, i) => {
    const msgs = byDoc.get(i);
    msgs ? fail(`${t.desc}: ${msgs.join("; ")}`) : ok(`${t.desc}: no unknown fields`);
  });
  fs.rmSync(dir, { recursive: true, force: true });
}

// ---- 4: the documents agree with each other ----
// Per deployment: each kustomization's rendering with the examples applied on their own (the
// Job, the Secrets' shapes); or, without kustomizations, every document together.
let objs = [];
const find = (kind, ns, name) => objs.find((o) => o.kind === kind && o.metadata && o.metadata.name === name && (o.metadata.namespace || "") === (ns || ""));
const matches = (selector, labels) => Object.entries(selector || {}).every(([k, v]) => (labels || {})[k] === v);
const quantity = (q) => {
  if (q === undefined) return undefined;
  const m = String(q).match(/^([0-9.]+)([KMGTE]i?|m)?$/);
  if (!m) return NaN;
  const mult = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, K: 1e3, M: 1e6, G: 1e9, T: 1e12, m: 1e-3 }[m[2]] || 1;
  return parseFloat(m[1]) * mult;
};
function sh(script, desc) {
  try {
    execFileSync("sh", ["-n"], { input: script, stdio: ["pipe", "ignore", "pipe"] });
    ok(`${desc}: shell script parses (sh -n)`);
  } catch (e) {
    fail(`${desc}: shell syntax: ${String(e.stderr).trim()}`);
  }
}

function checkPod(o, tmpl, desc) {
  const spec = tmpl.spec;
  const ns = o.metadata.namespace;
  const problems = [];
  const volumes = new Map((spec.volumes || []).map((v) => [v.name, v]));
  const containers = [...(spec.initContainers || []), ...spec.containers];
  for (const v of volumes.values()) {
    if (v.configMap && !find("ConfigMap", ns, v.configMap.name)) problems.push(`volume ${v.name}: no ConfigMap ${v.configMap.name}`);
    if (v.secret && !find("Secret", ns, v.secret.secretName)) problems.push(`volume ${v.name}: no Secret ${v.secret.secretName} (not even an example)`);
    if (v.persistentVolumeClaim && !find("PersistentVolumeClaim", ns, v.persistentVolumeClaim.claimName))
      problems.push(`volume ${v.name}: no PersistentVolumeClaim ${v.persistentVolumeClaim.claimName}`);
  }
  for (const c of containers) {
    for (const m of c.volumeMounts || []) if (!volumes.has(m.name)) problems.push(`${c.name}: mounts volume ${m.name}, which the pod does not have`);
    const names = (c.ports || []).map((p) => p.name).filter(Boolean);
    if (new Set(names).size !== names.length) problems.push(`${c.name}: port names repeat`);
    const req = (c.resources || {}).requests || {};
    const lim = (c.resources || {}).limits || {};
    for (const r of new Set([...Object.keys(req), ...Object.keys(lim)])) {
      // Hugepages and extended resources (devices) cannot be overcommitted: equal or absent.
      if ((r.startsWith("hugepages-") || r.includes("/")) && quantity(req[r]) !== quantity(lim[r]))
        problems.push(`${c.name}: ${r} requested ${req[r]} but limited ${lim[r]} (they must be equal)`);
    }
    const huge = Object.keys(lim).filter((r) => r.startsWith("hugepages-"));
    for (const h of huge) {
      const size = h.slice("hugepages-".length);
      const vol = [...volumes.values()].find((v) => v.emptyDir && (v.emptyDir.medium === `HugePages-${size}` || v.emptyDir.medium === "HugePages"));
      if (!vol || !(c.volumeMounts || []).some((m) => m.name === vol.name)) problems.push(`${c.name}: ${h} without a mounted HugePages-${size} emptyDir`);
    }
    for (const e of c.env || []) {
      const rf = e.valueFrom && e.valueFrom.resourceFieldRef;
      if (rf) {
        const target = containers.find((x) => x.name === (rf.containerName || c.name));
        const [kind, res] = rf.resource.split(".");
        if (!target) problems.push(`${c.name}: env ${e.name} refers to container ${rf.containerName}`);
        else if (!(((target.resources || {})[kind === "limits" ? "limits" : "requests"]) || {})[res])
          problems.push(`${c.name}: env ${e.name} reads ${rf.resource}, which ${target.name} does not set`);
      }
      const cm = e.valueFrom && e.valueFrom.configMapKeyRef;
      if (cm && !find("ConfigMap", ns, cm.name)) problems.push(`${c.name}: env ${e.name}: no ConfigMap ${cm.name}`);
    }
    const cmd = [...(c.command || []), ...(c.args || [])];
    const i = cmd.findIndex((x) => x === "-c");
    if (i > 0 && /(^|\/)(ba|da)?sh$/.test(cmd[0]) && cmd[i + 1]) sh(cmd[i + 1], `${desc}: ${c.name}`);
  }
  // Multus networks: each exists in the namespace, and an SR-IOV one's device plugin resource
  // is requested by a container (else the pod gets no VF and the CNI fails).
  const nets = ((tmpl.metadata || {}).annotations || {})["k8s.v1.cni.cncf.io/networks"];
  for (const n of (nets || "").split(",").map((x) => x.trim()).filter(Boolean)) {
    const [nns, nname] = n.includes("/") ? n.split("/") : [ns, n];
    const nad = find("NetworkAttachmentDefinition", nns, nname.split("@")[0]);
    if (!nad) problems.push(`network ${n}: no NetworkAttachmentDefinition`);
    else {
      const res = (nad.metadata.annotations || {})["k8s.v1.cni.cncf.io/resourceName"];
      if (res && !containers.some((c) => ((c.resources || {}).limits || {})[res])) problems.push(`network ${n}: no container requests ${res}`);
    }
  }
  problems.length ? fail(`${desc}: ${problems.join("; ")}`) : ok(`${desc}: volumes, resources, networks and scripts hang together`);
}

function crossCheck(label, docs) {
  objs = docs.map((d) => d.obj).filter((o) => isObject(o) && isObject(o.metadata) && o.kind !== "Kustomization");
  console.log(`-- ${label}: ${objs.length} objects`);
  const namespaces = new Set(objs.filter((o) => o.kind === "Namespace").map((o) => o.metadata.name));
  for (const o of objs) {
    if (o.kind === "Namespace") continue;
    const ns = o.metadata.namespace;
    if (!ns) fail(`${o.kind} ${o.metadata.name}: no namespace`);
    else if (namespaces.size && !namespaces.has(ns)) fail(`${o.kind} ${o.metadata.name}: namespace ${ns} is not defined here`);
  }
  for (const o of objs) {
    const desc = `${o.kind} ${o.metadata.name}`;
    if (o.kind === "DaemonSet" || o.kind === "Deployment" || o.kind === "Job") {
      const tmpl = o.spec.template;
      if (o.spec.selector && !matches(o.spec.selector.matchLabels, (tmpl.metadata || {}).labels))
        fail(`${desc}: the selector does not select its own pods`);
      checkPod(o, tmpl, desc);
    }
    if (o.kind === "ConfigMap") for (const [k, v] of Object.entries(o.data || {})) if (k.endsWith(".sh")) sh(v, `${desc}: ${k}`);
    if (o.kind === "Service" && o.spec.selector) {
      const pods = objs.filter((w) => ["DaemonSet", "Deployment"].includes(w.kind) && w.metadata.namespace === o.metadata.namespace &&
        matches(o.spec.selector, (w.spec.template.metadata || {}).labels));
      if (!pods.length) fail(`${desc}: selects no workload`);
      else {
        const portNames = new Set(pods.flatMap((w) => w.spec.template.spec.containers.flatMap((c) => (c.ports || []).map((p) => p.name))));
        const bad = o.spec.ports.filter((p) => typeof p.targetPort === "string" && !portNames.has(p.targetPort));
        bad.length ? fail(`${desc}: targetPort ${bad.map((p) => p.targetPort).join(", ")} not a container port of ${pods.map((w) => w.metadata.name)}`)
          : ok(`${desc}: selects ${pods.map((w) => w.kind + " " + w.metadata.name).join(", ")}, its target ports exist`);
      }
    }
    if (o.kind === "ServiceMonitor") {
      const nss = (o.spec.namespaceSelector || {}).matchNames || [o.metadata.namespace];
      const svcs = objs.filter((s) => s.kind === "Service" && nss.includes(s.metadata.namespace) && matches(o.spec.selector.matchLabels, s.metadata.labels));
      const ports = new Set(svcs.flatMap((s) => s.spec.ports.map((p) => p.name)));
      const bad = o.spec.endpoints.filter((e) => e.port && !ports.has(e.port));
      !svcs.length ? fail(`${desc}: selects no Service`) : bad.length ? fail(`${desc}: endpoint port ${bad.map((e) => e.port)} not a port of ${svcs.map((s) => s.metadata.name)}`)
        : ok(`${desc}: scrapes Service ${svcs.map((s) => s.metadata.name).join(", ")} port ${o.spec.endpoints.map((e) => e.port).join(", ")}`);
    }
    if (o.kind === "NetworkPolicy") {
      const pods = objs.filter((w) => ["DaemonSet", "Deployment"].includes(w.kind) && w.metadata.namespace === o.metadata.namespace &&
        matches(o.spec.podSelector.matchLabels, (w.spec.template.metadata || {}).labels));
      const allowed = new Set((o.spec.ingress || []).flatMap((r) => (r.ports || []).map((p) => p.port)));
      const svcPorts = objs.filter((s) => s.kind === "Service" && s.metadata.namespace === o.metadata.namespace && s.spec.selector &&
        pods.some((w) => matches(s.spec.selector, w.spec.template.metadata.labels))).flatMap((s) => s.spec.ports.map((p) => p.port));
      const shut = svcPorts.filter((p) => !allowed.has(p));
      !pods.length ? fail(`${desc}: selects no workload`) : shut.length ? fail(`${desc}: Service ports ${shut} are not admitted`)
        : ok(`${desc}: admits every Service port of ${pods.map((w) => w.metadata.name)}`);
    }
    if (o.kind === "PrometheusRule") checkRules(o, desc);
  }
}
const deployments = units.length ? units.map((u) => [u.name, [...u.docs, ...loose.filter((d) => d.obj && d.obj.kind !== "Kustomization")]]) : [["all", documents]];
for (const [label, docs] of deployments) crossCheck(label, docs);

// ---- PromQL ----
function checkRules(o, desc) {
  const { parser } = require("@prometheus-io/lezer-promql");
  let exported = null;
  if (metricsSources.length) {
    const src = metricsSources.map((f) => fs.readFileSync(f, "utf8")).join("\n");
    exported = new Set(src.match(/reefline_[a-z0-9_]+/g));
  }
  for (const g of o.spec.groups) for (const r of g.rules) {
    const name = `${desc}: ${r.alert || r.record}`;
    const tree = parser.parse(r.expr);
    const errors = [];
    tree.iterate({ enter: (n) => { if (n.type.isError) errors.push(n.from); } });
    if (errors.length) {
      fail(`${name}: PromQL syntax error at ${errors[0]}: '${r.expr.slice(Math.max(0, errors[0] - 20), errors[0] + 20).trim()}'`);
      continue;
    }
    const used = r.expr.match(/reefline_[a-z0-9_]+/g) || [];
    const unknown = exported ? used.filter((m) => !exported.has(m) && !exported.has(m.replace(/_(bucket|sum|count)$/, ""))) : [];
    unknown.length ? fail(`${name}: metrics the daemon does not export: ${[...new Set(unknown)].join(", ")}`)
      : ok(`${name}: PromQL parses${exported ? `, metrics exported (${[...new Set(used)].join(", ") || "none"})` : ""}`);
  }
}

// ---- kubectl kustomize agrees with this rendering ----
if (useKubectl) {
  const canon = (x, key) => {
    if (Array.isArray(x)) {
      const items = x.map((e) => canon(e, null));
      // Lists merged by key may come out in another order from kustomize.
      return mergeKeys[key] ? items.sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))) : items;
    }
    if (isObject(x)) return Object.fromEntries(Object.keys(x).sort().map((k) => [k, canon(x[k], k)]));
    return x;
  };
  for (const u of units) {
    let text;
    try {
      text = execFileSync("kubectl", ["kustomize", u.name], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (e) {
      fail(`kubectl kustomize ${u.name}: ${String(e.stderr).trim().split("\n").pop()}`);
      continue;
    }
    const theirs = new Map(YAML.parseAllDocuments(text, { version: "1.1" }).map((d) => d.toJS()).filter(Boolean).map((o) => [idOf(o), JSON.stringify(canon(o, null))]));
    const mine = new Map(u.docs.map((d) => [idOf(d.obj), JSON.stringify(canon(d.obj, null))]));
    const diff = [...new Set([...theirs.keys(), ...mine.keys()])].filter((k) => theirs.get(k) !== mine.get(k));
    diff.length ? fail(`kubectl kustomize ${u.name} differs from this check's rendering: ${diff.join(", ")}`)
      : ok(`kubectl kustomize ${u.name}: the same ${mine.size} objects as checked here`);
  }
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
