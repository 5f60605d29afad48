-- wrk script for bench/rpc/run.sh: POST a JSON-RPC workflow.start (wait=true) to /rpc.
-- Every response is checked: a non-200 status, or a body without "succeeded",
-- is counted and reported at the end (wrk's own "Non-2xx" line only sees the status).
wrk.method = "POST"
wrk.path = "/rpc"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"workflow.start","params":{"workflow":"echo","input":{"hello":"world"},"wait":true}}'

local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   bad = 0
end

function response(status, headers, body)
   if status ~= 200 or not string.find(body, '"succeeded"', 1, true) then
      bad = bad + 1
      if bad == 1 then
         io.stderr:write("first bad response: " .. status .. " " .. string.sub(body, 1, 300) .. "\n")
      end
   end
end

function done(summary, latency, requests)
   local total = 0
   for _, t in ipairs(threads) do
      total = total + t:get("bad")
   end
   io.write(string.format("bad responses: %d\n", total))
end
