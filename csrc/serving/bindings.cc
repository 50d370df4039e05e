// The Python side of the serving front ends: ServingPlan (plan.h's ModelPlan, typed and
// checked at construction), ServingFrontEnd (one model version, made from a
// ServingQueue and the plan paddle_ipu/serving/server.py makes), ServingServer
// (the models a server serves, its HTTP listeners, the repository's state and its
// load / unload requests), GrpcInferCall, and kserve_datatypes (the datatype table of
// dtypes.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <sstream>

#include "../core/bindings.h"
#include "front_end.h"
#include "grpc_call.h"
#include "metadata.h"
#include "requests.h"
#include "server.h"
#include "text.h"

namespace py = pybind11;

namespace paddle_ipu {
namespace serving {

namespace {

// The plan's checks at the boundary (ServingPlan's constructor): a plan the protocol
// code could misread (a unit that is not its tensor's bytes, a queue of no unit) is a
// ValueError naming the field, here, not a wrong answer later.
[[noreturn]] void Bad(const std::string& what) { throw py::value_error("ServingPlan: " + what); }

void CheckTensor(const ModelPlan& m, const TensorPlan& t) {
  const std::string what = "tensor " + Repr(t.name);
  if (t.name.empty()) Bad("a tensor's name is empty");
  if (t.unit_bytes < 0) Bad(what + ": unit_bytes " + std::to_string(t.unit_bytes) + " < 0");
  if (m.dynamic) return;  // a handler's tensors: -1 on any axis, no fixed unit
  if (t.shape.empty()) Bad(what + ": a fixed model's tensor has at least one dimension");
  for (size_t k = 0; k < t.shape.size(); ++k) {
    if (t.shape[k] >= 1 || (k == 0 && m.auto_batch && t.shape[k] == -1)) continue;
    Bad(what + ": dimension " + std::to_string(k) + " is " + std::to_string(t.shape[k]) +
        " in shape " + ShapeStr(t.shape) +
        " (only the first may be -1, and only when auto-batching)");
  }
  const int64_t size = ElemSize(t.dtype);
  if (size == 0) return;  // BYTES: elements of any length
  int64_t elems = 1;
  for (size_t k = m.auto_batch ? 1 : 0; k < t.shape.size(); ++k) elems *= t.shape[k];
  if (t.unit_bytes != elems * size) {
    Bad(what + ": unit_bytes " + std::to_string(t.unit_bytes) + " is not the bytes of one " +
        (m.auto_batch ? "row" : "micro-batch") + " of " + V2Name(t.dtype) + " " +
        ShapeStr(t.shape) + " (" + std::to_string(elems * size) + ")");
  }
}

void CheckPlan(const ModelPlan& m) {
  if (m.name.empty() || m.version.empty()) Bad("name and version must be non-empty");
  auto at_least = [](const char* field, double value, double low) {
    if (value < low) {
      std::ostringstream got;
      got << value;
      Bad(std::string(field) + " must be >= " + std::to_string(static_cast<int64_t>(low)) +
          ", got " + got.str());
    }
  };
  at_least("capacity", static_cast<double>(m.capacity), 1);
  at_least("limit", static_cast<double>(m.limit), 1);
  at_least("max_rows", static_cast<double>(m.max_rows), m.auto_batch ? 1 : 0);
  at_least("micro_batch_size", static_cast<double>(m.micro_batch_size), m.dynamic ? 0 : 1);
  at_least("batch_timeout_us", m.batch_timeout_us, 0);
  at_least("request_timeout_s", m.request_timeout_s, 0);
  at_least("max_body", static_cast<double>(m.max_body), 1);
  at_least("instance_count", static_cast<double>(m.instance_count), 1);
  at_least("workers", m.workers, 1);
  if (m.instance_kind != "KIND_CPU" && m.instance_kind != "KIND_MODEL") {
    Bad("instance_kind must be KIND_CPU or KIND_MODEL, got " + Repr(m.instance_kind));
  }
  if (m.dynamic && m.auto_batch) Bad("a dynamic model does not auto-batch");
  for (const TensorPlan& t : m.inputs) CheckTensor(m, t);
  for (const TensorPlan& t : m.outputs) CheckTensor(m, t);
}

// ServingRange, ServingTensor, ServingPlan: plan.h's structs, typed, made once by
// paddle_ipu/serving/server.py and checked here.
void RegisterPlan(py::module_& m) {
  py::class_<IndexRange>(m, "ServingRange",
                         "The values an integer input may take (compiler.model.IndexRange).")
      .def(py::init([](int64_t low, int64_t high, std::vector<int64_t> allowed,
                       std::optional<int64_t> column, std::string describe) {
             if (low > high) {
               throw py::value_error("ServingRange: low " + std::to_string(low) + " > high " +
                                     std::to_string(high));
             }
             IndexRange r;
             r.low = low;
             r.high = high;
             r.allowed = std::move(allowed);
             r.column = column.value_or(-1);
             r.describe = std::move(describe);
             return r;
           }),
           py::kw_only(), py::arg("low"), py::arg("high"), py::arg("allowed"),
           py::arg("column"), py::arg("describe"))
      .def_readonly("low", &IndexRange::low)
      .def_readonly("high", &IndexRange::high)
      .def_readonly("allowed", &IndexRange::allowed)
      .def_property_readonly("column",
                             [](const IndexRange& r) -> std::optional<int64_t> {
                               if (r.column < 0) return std::nullopt;
                               return r.column;
                             })
      .def_readonly("describe", &IndexRange::describe);

  py::class_<TensorPlan>(m, "ServingTensor",
                         "One input or output of a served model: its KServe datatype, the\n"
                         "shape of one request, the bytes of one queue unit (a row when\n"
                         "auto-batching, else the micro-batch; 0 for a dynamic model).")
      .def(py::init([](std::string name, const std::string& datatype,
                       std::vector<int64_t> shape, int64_t unit_bytes,
                       std::vector<IndexRange> ranges) {
             TensorPlan t;
             t.name = std::move(name);
             t.dtype = FromV2(datatype);
             if (t.dtype == DType::kInvalid) {
               throw py::value_error("ServingTensor " + Repr(t.name) +
                                     ": unknown KServe datatype " + Repr(datatype));
             }
             t.shape = std::move(shape);
             t.unit_bytes = unit_bytes;
             t.unit_elems = ElemSize(t.dtype) ? unit_bytes / ElemSize(t.dtype) : 0;  // BYTES: 0
             t.ranges = std::move(ranges);
             return t;
           }),
           py::kw_only(), py::arg("name"), py::arg("datatype"), py::arg("shape"),
           py::arg("unit_bytes"), py::arg("ranges") = std::vector<IndexRange>())
      .def_readonly("name", &TensorPlan::name)
      .def_property_readonly("datatype", [](const TensorPlan& t) { return V2Name(t.dtype); })
      .def_readonly("shape", &TensorPlan::shape)
      .def_readonly("unit_bytes", &TensorPlan::unit_bytes)
      .def_readonly("ranges", &TensorPlan::ranges);

  py::class_<ModelPlan>(
      m, "ServingPlan",
      "What the C++ front end checks a request of one model version against, and how it\n"
      "queues it: made once by paddle_ipu.serving.server, checked here (ValueError naming\n"
      "the field). `dynamic`: a handler's plan (shapes may hold -1 on any axis, `workers`\n"
      "threads hand requests to it).")
      .def(py::init([](std::string name, std::string version, std::string server_version,
                       bool auto_batch, int64_t max_rows, int64_t capacity, int64_t limit,
                       int64_t micro_batch_size, double batch_timeout_us,
                       double request_timeout_s, int64_t max_body,
                       std::vector<TensorPlan> inputs, std::vector<TensorPlan> outputs,
                       int64_t instance_count, std::string instance_kind, bool dynamic,
                       int workers) {
             ModelPlan p;
             p.name = std::move(name);
             p.version = std::move(version);
             p.server_version = std::move(server_version);
             p.auto_batch = auto_batch;
             p.max_rows = max_rows;
             p.capacity = capacity;
             p.limit = limit;
             p.micro_batch_size = micro_batch_size;
             p.batch_timeout_us = batch_timeout_us;
             p.request_timeout_s = request_timeout_s;
             p.max_body = max_body;
             p.inputs = std::move(inputs);
             p.outputs = std::move(outputs);
             p.instance_count = instance_count;
             p.instance_kind = std::move(instance_kind);
             p.dynamic = dynamic;
             p.workers = workers;
             CheckPlan(p);
             return p;
           }),
           py::kw_only(), py::arg("name"), py::arg("version"), py::arg("server_version"),
           py::arg("auto_batch"), py::arg("max_rows"), py::arg("capacity"), py::arg("limit"),
           py::arg("micro_batch_size"), py::arg("batch_timeout_us"),
           py::arg("request_timeout_s"), py::arg("max_body"), py::arg("inputs"),
           py::arg("outputs"), py::arg("instance_count") = 1,
           py::arg("instance_kind") = "KIND_CPU", py::arg("dynamic") = false,
           py::arg("workers") = 1)
      .def_readonly("name", &ModelPlan::name)
      .def_readonly("version", &ModelPlan::version)
      .def_readonly("server_version", &ModelPlan::server_version)
      .def_readonly("auto_batch", &ModelPlan::auto_batch)
      .def_readonly("max_rows", &ModelPlan::max_rows)
      .def_readonly("capacity", &ModelPlan::capacity)
      .def_readonly("limit", &ModelPlan::limit)
      .def_readonly("micro_batch_size", &ModelPlan::micro_batch_size)
      .def_readonly("batch_timeout_us", &ModelPlan::batch_timeout_us)
      .def_readonly("request_timeout_s", &ModelPlan::request_timeout_s)
      .def_readonly("max_body", &ModelPlan::max_body)
      .def_readonly("inputs", &ModelPlan::inputs)
      .def_readonly("outputs", &ModelPlan::outputs)
      .def_readonly("instance_count", &ModelPlan::instance_count)
      .def_readonly("instance_kind", &ModelPlan::instance_kind)
      .def_readonly("dynamic", &ModelPlan::dynamic)
      .def_readonly("workers", &ModelPlan::workers);
}

py::tuple ParsedTuple(const ModelPlan& m, const Error& e, const InferRequest& r) {
  if (e) return py::make_tuple(e.status, ValidUtf8(e.message), py::none());
  py::list inputs;
  for (size_t k = 0; k < m.inputs.size(); ++k) {
    inputs.append(py::bytes(r.in[k], static_cast<size_t>(r.units * m.inputs[k].unit_bytes)));
  }
  py::dict out;
  out["units"] = r.units;
  out["rows"] = r.rows;
  out["inputs"] = inputs;
  out["want"] = r.want;
  out["binary"] = std::vector<bool>(r.binary.begin(), r.binary.end());
  out["id"] = r.id;
  out["timeout_s"] = r.timeout_s;
  return py::make_tuple(0, std::string(), out);
}

py::tuple Datatypes() {
  py::tuple rows(kDTypeCount);
  for (int i = 0; i < kDTypeCount; ++i) {
    const DTypeInfo& t = Info(static_cast<DType>(i));
    rows[static_cast<size_t>(i)] = py::make_tuple(t.v2, t.numpy, t.size);
  }
  return rows;
}

}  // namespace

void RegisterServing(py::module_& m) {
  RegisterPlan(m);
  m.def("kserve_datatypes", &Datatypes,
        "The KServe v2 datatypes a served model's tensors may have, one row each:\n"
        "(v2 name, numpy dtype name, item size in bytes), e.g. ('FP32', 'float32', 4).");

  // A call belongs to the front end that took it; `front_end`, when given, must be
  // that one.
  auto check_call = [](GrpcCall& c, const py::object& fe) {
    if (!fe.is_none() && fe.cast<FrontEnd*>() != c.front_end()) {
      throw py::value_error("this call was not made by that ServingFrontEnd");
    }
  };
  py::class_<GrpcCall, std::shared_ptr<GrpcCall>>(
      m, "GrpcInferCall", "A ModelInfer call in the serving queue (made by grpc_infer).")
      .def(
          "result",
          [check_call](GrpcCall& c, double timeout, const py::object& fe) -> py::tuple {
            check_call(c, fe);
            int code;
            {
              py::gil_scoped_release nogil;
              code = c.Result(timeout);
            }
            if (code == 0) return py::make_tuple(0, py::bytes(c.response()));
            return py::make_tuple(code, py::str(c.message()));
          },
          py::arg("timeout"), py::arg("front_end") = py::none(),
          "Wait for the answer (without the GIL); a request not started within timeout\n"
          "seconds (> 0) is taken out of the queue. (0, response bytes) or (gRPC code, message).")
      .def(
          "cancel",
          [check_call](GrpcCall& c, const py::object& fe) {
            check_call(c, fe);
            return c.Cancel();
          },
          py::arg("front_end") = py::none(),
          "Drop the request if it has not started (the client went away).");

  py::class_<FrontEnd, std::shared_ptr<FrontEnd>>(
      m, "ServingFrontEnd",
      "One model version over its ServingQueue, for the KServe v2 front ends: HTTP\n"
      "(Boost.Beast, through a ServingServer) and the gRPC ModelInfer path; requests never\n"
      "touch Python (see csrc/serving).")
      .def(py::init([](py::object queue, const ModelPlan& plan) {
             auto fe = std::make_shared<FrontEnd>(queue, plan);
             fe->Start();
             return fe;
           }),
           py::arg("queue"), py::arg("plan"),
           "`queue`: a fixed model's ServingQueue, or (plan.dynamic) a dynamic model's\n"
           "handler (paddle_ipu.serving.dynamic.DynamicModel), run by plan.workers threads.")
      .def("stop_workers", &FrontEnd::StopWorkers, py::call_guard<py::gil_scoped_release>(),
           "A dynamic model: stop its workers once what was admitted was handed over (after\n"
           "close()).")
      .def("close", &FrontEnd::Close,
           "Refuse new requests (503) from now on: the model unloads or the server stops.")
      .def("drain", &FrontEnd::Drain, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Wait until every admitted request is answered; False on timeout (negative: no\n"
           "limit).")
      .def("shutdown", &FrontEnd::Close, "As close().")
      .def_property_readonly("name", [](FrontEnd& f) { return f.plan().name; })
      .def_property_readonly("version", [](FrontEnd& f) { return f.plan().version; })
      .def("set_ready", &FrontEnd::set_ready, py::arg("ready"))
      .def_property_readonly("ready", &FrontEnd::ready)
      .def_property_readonly("active", [](FrontEnd& f) { return f.active.load(); })
      .def(
          "grpc_infer",
          [](FrontEnd& f, py::bytes msg, std::string traceparent) {
            std::string data = msg;  // a copy: no Python object stays with the request
            py::gil_scoped_release nogil;
            return f.GrpcInfer(std::move(data), std::move(traceparent));
          },
          py::arg("message"), py::arg("traceparent") = std::string(),
          "Parse, check and queue a serialized ModelInferRequest (traceparent: the\n"
          "call's W3C trace context, for the access log).")
      .def(
          "add_route",
          [](FrontEnd& f, const py::object& queue, const ModelPlan& plan, const py::object& seq) {
            if (seq.is_none()) return f.AddRoute(queue, plan);
            Bucket b;
            b.length = seq["length"].cast<int64_t>();
            for (auto [name, v] : seq["inputs"].cast<py::dict>()) {
              auto pair = v.cast<py::tuple>();
              b.inputs[name.cast<std::string>()] = {pair[0].cast<std::vector<int64_t>>(),
                                                    pair[1].cast<std::string>()};
            }
            for (auto [name, v] : seq["outputs"].cast<py::dict>()) {
              b.outputs[name.cast<std::string>()] = v.cast<std::vector<int64_t>>();
            }
            return f.AddRoute(queue, plan, &b);
          },
          py::arg("queue"), py::arg("plan"), py::arg("bucket") = py::none(),
          "A dynamic model: serve requests of the shape of `plan` (the plan of one of its\n"
          "fixed runtimes, whose ServingQueue is `queue`) without Python from now on.\n"
          "`bucket`: the runtime is a bucket of sequence lengths, {'length': n, 'inputs':\n"
          "{name: (sequence axes, pad element bytes)}, 'outputs': {name: sequence axes}}:\n"
          "requests of every shorter length no shorter bucket holds are padded to it.\n"
          "Returns '' when routed, else why not (the handler keeps taking them).")
      .def_property_readonly("routes", &FrontEnd::routes,
                             "A dynamic model's input shapes served without Python.")
      .def(
          "remove_route",
          [](FrontEnd& f, const py::object& queue, const ModelPlan& plan) {
            return f.RemoveRoute(queue, plan);
          },
          py::arg("queue"), py::arg("plan"),
          "A dynamic model: stop routing the shape of `plan` to `queue` (given to\n"
          "add_route; its runtime has closed), keeping the queue's counters. Returns ''\n"
          "when removed, else why not.")
      .def(
          "set_specialisations",
          [](FrontEnd& f, const py::dict& d) {
            SpecialisationValues v;
            auto get = [&](const char* k) { return d.contains(k) ? d[k].cast<int64_t>() : 0; };
            v.resident = get("resident");
            v.resident_bytes = get("resident_bytes");
            v.bound_bytes = get("bound_bytes");
            v.max_count = get("max_count");
            v.made = get("made");
            v.restored = get("restored");
            v.evicted = get("evicted");
            v.making = get("making");
            v.make_seconds = d.contains("make_seconds") ? d["make_seconds"].cast<double>() : 0.0;
            f.SetSpecialisations(v);
          },
          py::arg("stats"),
          "A model compiled per input shape: its specialisations (SpecialisationStats'\n"
          "fields), shown in its statistics and /metrics from now on.")
      .def("server_metadata_json", [](FrontEnd& f) { return f.server_metadata(); })
      .def("metadata_json", [](FrontEnd& f) { return f.metadata(); })
      .def("config_json", [](FrontEnd& f) { return f.config(); })
      .def("stats_json", &FrontEnd::StatisticsJson)
      .def("prometheus", &FrontEnd::Prometheus)
      .def(
          "parse_http",
          [](FrontEnd& f, py::bytes head, py::bytes blob) {
            const std::string h = head, b = blob;
            InferRequest r;
            const Error e = ParseHttpInfer(f.plan(), h, b, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("head"), py::arg("blob") = py::bytes(),
          "Parse and check an HTTP infer request without queueing it (for tests):\n"
          "(0, '', dict) or (HTTP status, message, None).")
      .def(
          "parse_grpc",
          [](FrontEnd& f, py::bytes msg) {
            const std::string s = msg;
            InferRequest r;
            const Error e = ParseGrpcInfer(f.plan(), s, &r);
            return ParsedTuple(f.plan(), e, r);
          },
          py::arg("message"), "As parse_http, for a serialized ModelInferRequest.");

  py::class_<Server>(m, "ServingServer",
                     "The models a KServe v2 server serves (a ServingFrontEnd per version), its\n"
                     "HTTP listeners and IO threads, the routing of requests to their model, and\n"
                     "the model repository's state and load / unload requests.")
      .def(py::init([](std::string server_version, int64_t max_body, double header_timeout_s,
                       double idle_timeout_s, int64_t max_connections, int64_t max_header_bytes,
                       int64_t max_headers) {
             ServerLimits l;
             l.max_body = max_body;
             l.header_timeout_s = header_timeout_s;
             l.idle_timeout_s = idle_timeout_s;
             l.max_connections = max_connections;
             l.max_header_bytes = max_header_bytes;
             l.max_headers = max_headers;
             return std::make_unique<Server>(std::move(server_version), l);
           }),
           py::arg("server_version"), py::arg("max_body"), py::arg("header_timeout_s") = 60.0,
           py::arg("idle_timeout_s") = 75.0, py::arg("max_connections") = 1024,
           py::arg("max_header_bytes") = 64 << 10, py::arg("max_headers") = 100,
           "The server's limits (docs/serving.md): a timeout of 0 is none.")
      .def("add_model", &Server::AddModel, py::arg("front_end"),
           "Serve a front end as its plan's name and version (READY).")
      .def("set_state", &Server::SetState, py::arg("name"), py::arg("version"), py::arg("state"),
           py::arg("reason") = "",
           "A repository entry's state (READY, LOADING, UNLOADING, UNAVAILABLE) and reason;\n"
           "its front end is dropped unless UNLOADING.")
      .def("forget", &Server::Forget, py::arg("name"), py::arg("version"))
      .def(
          "find",
          [](Server& s, const std::string& name, const std::string& version) {
            Error e;
            std::shared_ptr<FrontEnd> fe = s.Find(name, version, &e, true);
            return py::make_tuple(fe ? py::cast(fe) : py::none(), e.status, e.message);
          },
          py::arg("name"), py::arg("version") = "",
          "(front end, 0, '') or (None, HTTP status, message): the version serving name\n"
          "(version '': the newest READY one); the message quotes names as Python does.")
      .def(
          "entries",
          [](Server& s) {
            py::list out;
            for (const ModelEntry& e : s.Entries()) {
              out.append(py::make_tuple(e.name, e.version, e.state, e.reason));
            }
            return out;
          },
          "[(name, version, state, reason)] in name and version order.")
      .def("index_json", &Server::IndexJson, py::arg("ready_only") = false)
      .def("metadata_json", [](Server& s, FrontEnd& fe) { return s.MetadataJson(fe); })
      .def(
          "stats_json",
          [](Server& s, const std::string& name, const std::string& version) {
            Error e;
            std::string doc = s.StatisticsJson(name, version, &e);
            return py::make_tuple(e.status, e ? e.message : doc);
          },
          py::arg("name") = "", py::arg("version") = "",
          "(0, statistics JSON) or (HTTP status, message).")
      .def("prometheus", &Server::Prometheus)
      .def("server_metadata_json", [](Server& s) { return s.server_metadata(); })
      .def_property_readonly("ready", &Server::ready)
      .def("set_ready", &Server::set_ready, py::arg("ready"))
      .def_property_readonly("active", &Server::active)
      .def("start_http", &Server::StartHttp, py::arg("host"), py::arg("port"),
           py::arg("threads") = 1, py::arg("reuse_port") = false,
           py::call_guard<py::gil_scoped_release>(),
           "Listen on host:port with `threads` IO threads; returns the port.")
      .def("stop_accepting", &Server::StopAccepting,
           "Drain: close the listening sockets and idle connections; answer what is in flight.")
      .def("drain", &Server::Drain, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Wait until every model's admitted requests are answered and every connection\n"
           "closed; False on timeout (negative: no limit).")
      .def("shutdown", &Server::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def(
          "grpc_infer",
          [](Server& s, py::bytes msg, std::string traceparent) {
            std::string data = msg;
            py::gil_scoped_release nogil;
            return s.GrpcInfer(std::move(data), std::move(traceparent));
          },
          py::arg("message"), py::arg("traceparent") = std::string(),
          "Route a serialized ModelInferRequest to its model; parse, check and queue it\n"
          "(traceparent: the call's W3C trace context, for the access log).")
      .def("start_grpc", &Server::StartGrpc, py::arg("host"), py::arg("port"),
           py::arg("reuse_port") = false, py::call_guard<py::gil_scoped_release>(),
           "Listen for gRPC (HTTP/2, nghttp2) on host:port on every IO thread (after\n"
           "start_http); returns the port. ModelInfer and the control RPCs run without\n"
           "Python; the repository's load / unload are taken by next_grpc().")
      .def(
          "next_grpc",
          [](Server& s, double timeout) -> py::object {
            std::shared_ptr<GrpcUnaryJob> job;
            {
              py::gil_scoped_release nogil;
              job = s.NextGrpcUnary(timeout);
            }
            if (!job) return py::none();
            return py::make_tuple(job->id, job->method, py::bytes(job->body));
          },
          py::arg("timeout"),
          "The next gRPC call for the Python side: (id, method, request bytes), or None\n"
          "on timeout or once the server shut down.")
      .def(
          "grpc_done",
          [](Server& s, int64_t id, int code, std::string message, py::bytes body) {
            std::string b = body;
            py::gil_scoped_release nogil;
            s.GrpcUnaryDone(id, code, std::move(message), std::move(b));
          },
          py::arg("id"), py::arg("code"), py::arg("message"), py::arg("body"),
          "Answer gRPC call `id`: code 0 and the serialized response, or a gRPC code and\n"
          "its message.")
      .def("close_grpc", &Server::CloseGrpcUnary, py::call_guard<py::gil_scoped_release>(),
           "No more gRPC calls for next_grpc(): those queued are answered UNAVAILABLE.")
      .def("open_access_log", &Server::OpenAccessLog, py::arg("path"),
           "Write one JSON line per inference request to path ('-': standard error),\n"
           "before start_http.")
      .def("flush_access_log", &Server::FlushAccessLog, py::call_guard<py::gil_scoped_release>())
      .def("enable_control", &Server::EnableControl,
           "Hand HTTP load / unload requests to next_control() (else they are refused).")
      .def(
          "next_control",
          [](Server& s, double timeout) -> py::object {
            std::shared_ptr<ControlJob> job;
            {
              py::gil_scoped_release nogil;
              job = s.NextControl(timeout);
            }
            if (!job) return py::none();
            return py::make_tuple(job->id, job->action, job->model, py::bytes(job->body));
          },
          py::arg("timeout"),
          "The next HTTP load / unload request: (id, action, model, body bytes), or None\n"
          "on timeout or once close_control() was called.")
      .def("control_done", &Server::ControlDone, py::arg("id"), py::arg("status"),
           py::arg("body"), "Answer load / unload request `id`: an HTTP status and a JSON body.")
      .def("close_control", &Server::CloseControl,
           "No more load / unload requests: those queued are answered 503.");
}

}  // namespace serving
}  // namespace paddle_ipu
